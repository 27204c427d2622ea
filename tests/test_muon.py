"""Tests for tinygpt.muon: Newton-Schulz and Muon step by step against torch.optim.Muon, the AdamW
groups against torch.optim.AdamW, the split of a GPT's parameters, clip_grad_norm against torch's,
and training with TrainConfig(optimizer="muon"): it learns, and resumes bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch.optim._muon import _zeropower_via_newtonschulz

from tinygpt.checkpoint import load_checkpoint
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.muon import NS_COEFFICIENTS, Muon, clip_grad_norm, configure_muon, newton_schulz
from tinygpt.train import configure_optimizer, train

SHAPES = [(8, 8), (16, 6), (6, 16)]


@pytest.mark.parametrize("shape", SHAPES)
def test_newton_schulz_matches_torch_and_nearly_orthogonalises(shape):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    ours = newton_schulz(G)
    ref = _zeropower_via_newtonschulz(G, NS_COEFFICIENTS, 5, 1e-7)
    assert ours.dtype == ref.dtype == torch.bfloat16 and ours.shape == G.shape
    torch.testing.assert_close(ours.float(), ref.float(), atol=2e-2, rtol=2e-2)
    s = torch.linalg.svdvals(ours.float())  # about U V^T: singular values near 1, not G's
    assert s.min() > 0.5 and s.max() < 1.5
    assert torch.linalg.svdvals(G).max() / torch.linalg.svdvals(G).min() > 2


def twin_params(seed: int) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(s, generator=g) for s in SHAPES]
    return ([torch.nn.Parameter(w.clone()) for w in ws], [torch.nn.Parameter(w.clone())
                                                         for w in ws])


def run_steps(opts, params_pairs, steps: int, seed: int, lr_schedule=None):
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for pair in zip(*params_pairs, strict=True):
            grad = torch.randn(pair[0].shape, generator=g)
            for p in pair:
                p.grad = grad.clone()
        for opt in opts:
            if lr_schedule:
                for group in opt.param_groups:
                    group["lr"] = lr_schedule[step]
            opt.step()


@pytest.mark.parametrize(("nesterov", "adjust_lr_fn", "weight_decay"), [
    (True, None, 0.1), (False, "original", 0.0), (True, "match_rms_adamw", 0.05)])
def test_muon_takes_torchs_steps(nesterov, adjust_lr_fn, weight_decay):
    ours, theirs = twin_params(1)
    kwargs = dict(lr=0.02, weight_decay=weight_decay, momentum=0.9, nesterov=nesterov,
                  adjust_lr_fn=adjust_lr_fn)
    opts = [Muon(ours, ns_dtype="bfloat16", **kwargs), torch.optim.Muon(theirs, **kwargs)]
    start = [p.detach().clone() for p in ours]
    run_steps(opts, (ours, theirs), 6, seed=2, lr_schedule=[0.02, 0.03, 0.01, 0.02, 0.02, 0.005])
    for a, b, s in zip(ours, theirs, start, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(a, s)  # it moved
        torch.testing.assert_close(opts[0].state[a]["momentum_buffer"],
                                   opts[1].state[b]["momentum_buffer"])


def test_muons_defaults_are_torchs():
    ours, theirs = twin_params(3)
    opts = [Muon(ours, ns_dtype="bfloat16"), torch.optim.Muon(theirs)]
    for key in ("lr", "weight_decay", "momentum", "nesterov", "eps", "ns_steps", "adjust_lr_fn"):
        assert opts[0].defaults[key] == opts[1].defaults[key], key
    assert tuple(opts[0].defaults["ns_coefficients"]) == tuple(opts[1].defaults["ns_coefficients"])
    run_steps(opts, (ours, theirs), 3, seed=4)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_adamw_groups_take_torchs_adamw_steps():
    g = torch.Generator().manual_seed(5)
    ws = [torch.randn(7, generator=g), torch.randn(4, 3, generator=g)]
    ours = [torch.nn.Parameter(w.clone()) for w in ws]
    theirs = [torch.nn.Parameter(w.clone()) for w in ws]
    opts = [Muon(ours, lr=3e-3, weight_decay=0.1, use_muon=False, betas=(0.9, 0.95)),
            torch.optim.AdamW(theirs, lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95),
                              foreach=False)]
    run_steps(opts, (ours, theirs), 5, seed=6, lr_schedule=[1e-3, 3e-3, 3e-3, 2e-3, 1e-3])
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(opts[0].state[a]["exp_avg_sq"], opts[1].state[b]["exp_avg_sq"])


def test_muon_refuses_what_it_cannot_update():
    with pytest.raises(ValueError, match=r"2-D matrices only.*use_muon=False"):
        Muon([torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        Muon([torch.nn.Parameter(torch.zeros(3, 3))], adjust_lr_fn="rms")
    with pytest.raises(ValueError, match="momentum"):
        Muon([torch.nn.Parameter(torch.zeros(3, 3))], momentum=1.5)
    Muon([torch.nn.Parameter(torch.zeros(3))], use_muon=False)  # AdamW takes vectors


CONFIG = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16)


@pytest.mark.parametrize("tie", [True, False])
def test_the_split_gives_the_blocks_matrices_to_muon_and_the_rest_to_adamw(tie):
    model = GPT(GPTConfig(**{**CONFIG.__dict__, "tie_weights": tie}))
    opt = configure_muon(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [[names[id(p)] for p in g["params"]] for g in opt.param_groups]
    muon, adam_matrices, adam_vectors = groups
    assert [g["use_muon"] for g in opt.param_groups] == [True, False, False]
    assert muon == [n for n in names.values() if n.startswith("transformer.h.")
                    and n.endswith("weight") and ("c_" in n)]
    assert adam_matrices == ["transformer.embed.wte.weight", "transformer.embed.wpe.weight"] + (
        [] if tie else ["lm_head.weight"])
    assert all(n.endswith(("bias", "ln_1.weight", "ln_2.weight", "ln_f.weight"))
               for n in adam_vectors)
    assert opt.param_groups[2]["weight_decay"] == 0.0 and opt.param_groups[0]["weight_decay"] == 0.1
    assert sum(map(len, groups)) == len(names)
    assert isinstance(configure_optimizer(model, TrainConfig(optimizer="muon")), Muon)
    assert isinstance(configure_optimizer(model, TrainConfig()), torch.optim.AdamW)


# --- clip_grad_norm ------------------------------------------------------------------------------

@pytest.mark.parametrize("max_norm", [0.1, 1.0, 100.0])
def test_clip_grad_norm_matches_torch(max_norm):
    g = torch.Generator().manual_seed(7)
    shapes = [(5, 3), (3,), (2, 2, 2)]
    ours = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    theirs = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for a, b in zip(ours, theirs, strict=True):
        a.grad = torch.randn(a.shape, generator=g)
        b.grad = a.grad.clone()
    before = [p.grad.clone() for p in ours]
    total = clip_grad_norm(ours, max_norm)
    torch.testing.assert_close(total, torch.nn.utils.clip_grad_norm_(theirs, max_norm))
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    clipped = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ours]))
    if total > max_norm:
        assert clipped == pytest.approx(max_norm, rel=1e-4)
    else:
        assert all(torch.equal(p.grad, old) for p, old in zip(ours, before, strict=True))


def test_clip_grad_norm_checks_its_bound():
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm([], 0.0)


# --- training with Muon --------------------------------------------------------------------------

TEXT = "the quick brown fox jumps over the lazy dog; a lazy dog sleeps in the sun. " * 30
IDS = torch.tensor([ord(c) % 32 for c in TEXT])
TRAIN, VAL = IDS[:2000], IDS[2000:]
CFG = TrainConfig(batch_size=4, max_iters=6, warmup_iters=1, learning_rate=3e-3, min_lr=3e-4,
                  eval_interval=3, eval_iters=2, optimizer="muon")


def without_timing(history):
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in history]


def test_training_with_muon_learns_and_resumes_bit_for_bit(tmp_path):
    straight = train(CONFIG, CFG, TRAIN, VAL, out_dir=tmp_path / "a", progress=False)
    assert straight[-1]["val_loss"] < straight[0]["val_loss"] - 0.1
    stopped = train(CONFIG, CFG, TRAIN, VAL, out_dir=tmp_path / "b", progress=False,
                    callback=lambda record, model: record["step"] == 3)
    assert stopped[-1]["step"] == 3
    ckpt = load_checkpoint(tmp_path / "b")
    assert ckpt.train_config.optimizer == "muon"
    assert [g["use_muon"] for g in ckpt.optimizer_state["param_groups"]] == [True, False, False]
    resumed = train(CONFIG, CFG, TRAIN, VAL, out_dir=tmp_path / "b", resume=True, progress=False)
    assert without_timing(resumed) == without_timing(straight)
    a, b = load_checkpoint(tmp_path / "a"), load_checkpoint(tmp_path / "b")
    for name, t in a.model.state_dict().items():
        assert torch.equal(t, b.model.state_dict()[name]), name
    for i, state in a.optimizer_state["state"].items():
        for key, t in state.items():
            assert torch.equal(t, b.optimizer_state["state"][i][key]), (i, key)


def test_adamw_lr_scale_scales_the_adamw_parts_steps_and_no_other():
    """One step from the same weights and batch: AdamW's first update is linear in its rate
    (with decoupled decay), so the embeddings and the untied head move ``scale`` times as far;
    Muon's matrices move exactly as without the scale."""
    config = GPTConfig(**{**CONFIG.__dict__, "tie_weights": False})
    moved = {}
    for scale in (1.0, 4.0):
        torch.manual_seed(0)
        model = GPT(config)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        cfg = TrainConfig(**{**CFG.__dict__, "max_iters": 1, "warmup_iters": 1,
                             "adamw_lr_scale": scale, "eval_interval": 1})
        train(config, cfg, TRAIN, VAL, model=model, progress=False)
        moved[scale] = {n: p.detach() - before[n] for n, p in model.named_parameters()}
    adamw = ["transformer.embed.wte.weight", "lm_head.weight", "transformer.ln_f.weight"]
    for name in adamw:
        assert moved[1.0][name].abs().max() > 0, name
        torch.testing.assert_close(moved[4.0][name], 4 * moved[1.0][name], rtol=1e-4,
                                   atol=1e-7)
    for name in moved[1.0]:
        if name.startswith("transformer.h.") and name.endswith("c_fc.weight"):
            assert moved[1.0][name].abs().max() > 0
            torch.testing.assert_close(moved[4.0][name], moved[1.0][name], rtol=0, atol=0)
    opt = configure_muon(GPT(config), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99),
                         adamw_lr_scale=4.0)
    assert [g["lr_scale"] for g in opt.param_groups] == [1.0, 4.0, 4.0]
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-3, 4e-3, 4e-3])


def test_muon_and_adamw_train_differently():
    adamw = train(CONFIG, TrainConfig(**{**CFG.__dict__, "optimizer": "adamw"}), TRAIN, VAL,
                  progress=False)
    muon = train(CONFIG, CFG, TRAIN, VAL, progress=False)
    assert adamw[1]["loss"] == muon[1]["loss"]  # the same first batch and initial weights
    assert adamw[-1]["loss"] != muon[-1]["loss"]


def test_an_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="optimizer"):
        TrainConfig(optimizer="sgd")
