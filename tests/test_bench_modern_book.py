"""benchmarks/modern_book.py: a candidate chosen on the selection split never trains on it; the
levers of benchmarks/levers_model.py (value embeddings, U-net skips) start as the plain model,
do what they say, train with AdamW and run in a job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import modern_book
from levers_model import LeverGPT, added_parameters, unet_mirror

from tinygpt import data
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.train import configure_optimizer


def test_a_selection_run_trains_on_the_first_90_percent_and_scores_the_rest(monkeypatch,
                                                                           tmp_path):
    generator = torch.Generator().manual_seed(0)
    train_ids = torch.randint(0, 70, (6000,), generator=generator)
    val_ids = torch.randint(0, 70, (800,), generator=generator)
    monkeypatch.setattr(modern_book, "book_data", lambda: (None, train_ids, val_ids))
    seen: dict = {}
    real_train, real_score = modern_book.train, modern_book.score

    def spy_train(model_cfg, cfg, fit_on, check_on, **kwargs):
        seen["fit_on"], seen["check_on"] = fit_on, check_on
        return real_train(model_cfg, cfg, fit_on, check_on, **kwargs)

    scored = []

    def spy_score(model, ids, block_size):
        scored.append(ids)
        return real_score(model, ids, block_size)

    monkeypatch.setattr(modern_book, "train", spy_train)
    monkeypatch.setattr(modern_book, "score", spy_score)
    job = {"name": "tiny", "shape": [1, 16, 2, 16, 4], "lr": 5e-3, "steps": 3, "seed": 0,
           "device": "cpu", "split": "selection", "save": str(tmp_path / "w.pt")}
    row = modern_book.run_one(job)
    fit_on, select = data.split_train_val(train_ids)
    assert torch.equal(seen["fit_on"], fit_on) and torch.equal(seen["check_on"], select)
    assert len(fit_on) + len(select) == len(train_ids) and len(select) == 600
    assert [len(ids) for ids in scored] == [600, 800]  # the selection split, then validation
    assert torch.equal(scored[0], select) and torch.equal(scored[1], val_ids)
    assert row["selection_loss"] != row["whole_val_loss"]
    model = GPT(modern_book.configs((1, 16, 2, 16, 4), 5e-3, 3)[0])
    model.load_state_dict(torch.load(tmp_path / "w.pt", weights_only=True))
    assert real_score(model, select, 16) == row["selection_loss"]  # the weights it scored


def test_a_run_without_the_selection_split_trains_on_all_of_the_training_text(monkeypatch):
    train_ids = torch.randint(0, 70, (3000,), generator=torch.Generator().manual_seed(1))
    val_ids = torch.randint(0, 70, (500,), generator=torch.Generator().manual_seed(2))
    monkeypatch.setattr(modern_book, "book_data", lambda: (None, train_ids, val_ids))
    seen = []
    real_train = modern_book.train
    monkeypatch.setattr(modern_book, "train", lambda m, c, fit_on, check_on, **kw: (
        seen.append((fit_on, check_on)) or real_train(m, c, fit_on, check_on, **kw)))
    row = modern_book.run_one({"name": "tiny", "shape": [1, 16, 2, 16, 4], "lr": 5e-3,
                               "steps": 2, "seed": 0, "device": "cpu"})
    assert torch.equal(seen[0][0], train_ids) and torch.equal(seen[0][1], val_ids)
    assert "selection_loss" not in row and row["whole_val_loss"] > 0


def test_levers_are_compared_with_the_base_seed_by_seed_on_the_selection_split():
    def run(tag, seed, selection, val, split="selection"):
        return {"tag": tag, "seed": seed, "name": "s", "lr": 5e-3, "steps": 10, "split": split,
                "selection_loss": selection, "whole_val_loss": val}

    rows = [run("base", 1, 1.50, 1.40), run("base", 2, 1.60, 1.45), run("base", 3, 1.55, 1.42),
            run("cap", 1, 1.48, 1.41), run("cap", 2, 1.57, 1.43),  # seeds 1 and 2 only
            run("cap", 9, 1.00, 1.00, split=None)]  # not a selection run: left out
    table = {row["tag"]: row for row in modern_book.summarise_levers(rows)}
    cap = table["cap"]
    assert cap["seeds"] == cap["paired_seeds"] == [1, 2]
    assert cap["selection_loss"] == pytest.approx(1.525)
    assert cap["change"] == pytest.approx(-0.025)  # -0.02 and -0.03
    assert (cap["change_low"], cap["change_high"]) == pytest.approx((-0.03, -0.02))
    assert cap["val_change"] == pytest.approx(-0.005)  # +0.01 and -0.02
    assert table["base"]["change"] == 0 and list(table) == ["base", "cap"]
    assert cap["base_spread"] == pytest.approx(0.10)
    with pytest.raises(ValueError, match="base"):
        modern_book.summarise_levers(rows[3:])


def test_levers_are_paired_only_with_the_base_of_their_own_cpu():
    def run(cpu, tag, seed, selection):
        return {"cpu": cpu, "tag": tag, "seed": seed, "name": "s", "lr": 5e-3, "steps": 10,
                "split": "selection", "selection_loss": selection, "whole_val_loss": 1.0}

    rows = [run("Intel", "base", 1, 1.50), run("Intel", "cap", 1, 1.49),
            run("AMD", "base", 1, 1.40), run("AMD", "ve", 1, 1.45), run("AMD", "cap", 1, 1.30)]
    table = modern_book.summarise_levers(rows)
    assert [(row["cpu"], row["tag"]) for row in table] == [
        ("Intel", "base"), ("Intel", "cap"), ("AMD", "base"), ("AMD", "cap"), ("AMD", "ve")]
    change = {(row["cpu"], row["tag"]): row["change"] for row in table}
    assert change[("Intel", "cap")] == pytest.approx(-0.01)
    assert change[("AMD", "cap")] == pytest.approx(-0.10)
    assert change[("AMD", "ve")] == pytest.approx(0.05)
    with pytest.raises(ValueError, match="no run on AMD is tagged 'base'"):
        modern_book.summarise_levers([r for r in rows if r["tag"] != "base" or r["cpu"] != "AMD"])


# --- benchmarks/levers_model.py: value embeddings and U-net skips, for the selection split ------

def small_config(n_layer: int = 3) -> GPTConfig:
    """The modern model (RoPE, QK-norm, ReLU², RMSNorm, untied head) at a tiny size."""
    return modern_book.configs((n_layer, 16, 2, 8, 2), 5e-3, 3,
                               model_changes={"tie_weights": False})[0]


def plain_and_lever(config: GPTConfig, **levers: bool) -> tuple[GPT, LeverGPT]:
    """A ``GPT`` and a ``LeverGPT`` sharing every plain part, each weight moved off its
    initialisation (the zero-initialised projections would hide what the blocks do)."""
    lever = LeverGPT(config, **levers)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in lever.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))
    plain = GPT(config)
    plain.load_state_dict({name: lever.state_dict()[name] for name in plain.state_dict()})
    return plain, lever


def some_ids(config: GPTConfig, seed: int = 4) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (2, config.block_size + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]  # inputs, next tokens: (2, T) each


def reference_logits(model: LeverGPT, idx: Tensor, skips: dict[int, int]) -> Tensor:
    """The logits written out from the package's own parts: each block called as it is, its
    values mixed with its table by a hook on ``c_attn``'s output (the ``v`` third) when the
    model has value embeddings, and block ``j``'s input given block ``skips[j]``'s output."""
    C = model.config.n_embd
    x = model.transformer.embed.wte(idx)  # RoPE: no positions added
    outputs = []
    for i, block in enumerate(model.transformer.h):
        if i in skips:
            x = x + model.skip_scales[skips[i]] * outputs[skips[i]]
        handle = None
        if model.use_value_embeddings:
            ve = model.value_embeddings[i](idx)
            a, b = model.value_scales[i], model.value_embedding_scales[i]

            def mix(_module, _inputs, qkv, ve=ve, a=a, b=b):
                return torch.cat([qkv[..., :2 * C], a * qkv[..., 2 * C:] + b * ve], dim=-1)

            handle = block.attn.c_attn.register_forward_hook(mix)
        x = block(x)
        if handle is not None:
            handle.remove()
        outputs.append(x)
    return model.lm_head(model.transformer.ln_f(x))


def test_lever_gpt_with_no_lever_is_the_plain_gpt():
    config = small_config()
    torch.manual_seed(11)
    plain = GPT(config)
    torch.manual_seed(11)
    lever = LeverGPT(config)
    assert plain.state_dict().keys() == lever.state_dict().keys()  # no new parameter
    assert all(torch.equal(p, q) for p, q in zip(plain.state_dict().values(),
                                                 lever.state_dict().values()))
    plain, lever = plain_and_lever(config)
    idx, targets = some_ids(config)
    (plain_logits, plain_loss), (lever_logits, lever_loss) = (
        plain(idx, targets), lever(idx, targets))
    assert torch.allclose(plain_logits, lever_logits) and torch.allclose(plain_loss, lever_loss)
    assert torch.allclose(lever(idx, last_only=True), plain_logits[:, -1:])


def test_levers_draw_the_plain_parts_as_the_plain_model_does():
    config = small_config()
    torch.manual_seed(12)
    plain = GPT(config).state_dict()
    torch.manual_seed(12)
    lever = LeverGPT(config, value_embeddings=True, unet_skips=True).state_dict()
    assert all(torch.equal(plain[name], lever[name]) for name in plain)
    assert torch.equal(lever["value_embedding_scales"], torch.zeros(3))  # start as the plain
    assert torch.equal(lever["value_scales"], torch.ones(3))
    assert torch.equal(lever["skip_scales"], torch.zeros(1))


def test_value_embeddings_start_as_the_plain_model_then_mix_into_the_values_and_learn():
    config = small_config()
    plain, lever = plain_and_lever(config, value_embeddings=True)
    idx, targets = some_ids(config)
    with torch.no_grad():  # as they start: a = 1, b = 0 (the tables random, moved)
        lever.value_scales.fill_(1.0)
        lever.value_embedding_scales.zero_()
    _, loss = lever(idx, targets)
    assert torch.allclose(lever(idx), plain(idx))
    loss.backward()  # at b = 0, b still has a gradient (the tables are random)
    assert (lever.value_embedding_scales.grad != 0).all()
    with torch.no_grad():
        lever.value_embedding_scales.copy_(torch.tensor([0.7, -0.4, 1.1]))
        lever.value_scales.copy_(torch.tensor([0.9, 1.2, 0.6]))
    lever.zero_grad()
    logits, loss = lever(idx, targets)
    assert not torch.allclose(logits, plain(idx), atol=1e-3)
    assert torch.allclose(logits, reference_logits(lever, idx, {}), atol=1e-5)
    loss.backward()
    seen = idx.unique()
    for table in lever.value_embeddings:  # every block's table, at the ids it looked up
        assert (table.weight.grad[seen].abs().sum(dim=1) > 0).all()
        unseen = torch.ones(config.vocab_size, dtype=torch.bool)
        unseen[seen] = False
        assert (table.weight.grad[unseen] == 0).all()
    assert (lever.value_scales.grad != 0).all() and (lever.value_embedding_scales.grad != 0).all()


@pytest.mark.parametrize("n_layer, mirror", [(3, {2: 0}), (4, {3: 0, 2: 1}), (1, {})])
def test_unet_skips_add_block_i_output_to_block_l_minus_1_minus_i_input(n_layer, mirror):
    assert unet_mirror(n_layer) == mirror
    config = small_config(n_layer)
    plain, lever = plain_and_lever(config, unet_skips=True)
    idx, targets = some_ids(config)
    assert lever.skip_scales.shape == (n_layer // 2,)
    with torch.no_grad():
        lever.skip_scales.zero_()
    assert torch.allclose(lever(idx), plain(idx))
    if not mirror:
        return
    with torch.no_grad():
        lever.skip_scales.copy_(torch.tensor([0.8, -0.6][: n_layer // 2]))
    logits, loss = lever(idx, targets)
    assert not torch.allclose(logits, plain(idx), atol=1e-3)
    assert torch.allclose(logits, reference_logits(lever, idx, mirror), atol=1e-5)
    loss.backward()
    assert (lever.skip_scales.grad != 0).all()


def test_both_levers_together_match_the_written_out_model():
    config = small_config(4)
    _, lever = plain_and_lever(config, value_embeddings=True, unet_skips=True)
    idx, _ = some_ids(config)
    assert torch.allclose(lever(idx), reference_logits(lever, idx, {3: 0, 2: 1}), atol=1e-5)


def test_the_new_parameters_train_with_adamw_not_muon():
    model_cfg, cfg = modern_book.configs((3, 16, 2, 8, 2), 5e-3, 3,
                                         model_changes={"tie_weights": False})
    model = LeverGPT(model_cfg, value_embeddings=True, unet_skips=True)
    optimizer = configure_optimizer(model, cfg)
    group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    assert len(group_of) == len(list(model.parameters()))  # every parameter, once
    wte = group_of[id(model.transformer.embed.wte.weight)]
    for table in model.value_embeddings:  # embeddings: AdamW, with wte's weight decay
        assert group_of[id(table.weight)] is wte and not wte["use_muon"]
        assert wte["weight_decay"] == cfg.weight_decay > 0
    for scales in (model.value_scales, model.value_embedding_scales, model.skip_scales):
        group = group_of[id(scales)]  # scalars: AdamW, no weight decay (like the norms' gains)
        assert not group["use_muon"] and group["weight_decay"] == 0.0
    muon = [group for group in optimizer.param_groups if group["use_muon"]]
    names = {id(p): name for name, p in model.named_parameters()}
    assert all(names[id(p)].startswith("transformer.h.") for g in muon for p in g["params"])


def test_run_one_trains_and_scores_a_lever_gpt_when_a_job_asks(monkeypatch, tmp_path):
    train_ids = torch.randint(0, 70, (3000,), generator=torch.Generator().manual_seed(5))
    val_ids = torch.randint(0, 70, (500,), generator=torch.Generator().manual_seed(6))
    monkeypatch.setattr(modern_book, "book_data", lambda: (None, train_ids, val_ids))
    trained = []
    real_train = modern_book.train

    def spy_train(model_cfg, cfg, fit_on, check_on, **kwargs):
        trained.append(kwargs["model"])
        return real_train(model_cfg, cfg, fit_on, check_on, **kwargs)

    monkeypatch.setattr(modern_book, "train", spy_train)
    levers = {"value_embeddings": True, "unet_skips": True}
    job = {"name": "tiny", "shape": [3, 16, 2, 16, 4], "lr": 5e-3, "steps": 3, "seed": 0,
           "device": "cpu", "split": "selection", "tag": "ve+unet",
           "model_changes": {"tie_weights": False}, "model_levers": levers,
           "save": str(tmp_path / "w.pt")}
    row = modern_book.run_one(job)
    model = trained[0]
    assert type(model) is LeverGPT and model.use_value_embeddings and model.use_unet_skips
    assert (model.value_embedding_scales != 0).all() and (model.skip_scales != 0).all()  # trained
    again = LeverGPT(modern_book.configs((3, 16, 2, 16, 4), 5e-3, 3,
                                         model_changes={"tie_weights": False})[0], **levers)
    again.load_state_dict(torch.load(tmp_path / "w.pt", weights_only=True))
    _, select = data.split_train_val(train_ids)
    assert modern_book.score(again, select, 16) == row["selection_loss"]  # the weights scored
    assert row["model_levers"] == levers and "value_embeddings" in modern_book.describe(row)
    assert modern_book.summarise_levers([{**row, "tag": "base"}])[0]["model_levers"] == levers
    assert "ve+unet" in modern_book.LEVERS
    modern_book.run_one({**job, "model_levers": None, "save": None})
    modern_book.run_one({key: v for key, v in job.items() if key not in ("model_levers", "save")})
    assert [type(m) for m in trained[1:]] == [GPT, GPT]  # no lever asked: the package's GPT


def test_the_levers_add_a_table_and_two_scalars_per_block_and_a_scalar_per_skip():
    config = small_config(5)
    tables = 5 * (config.vocab_size * config.n_embd + 2)
    assert added_parameters(config) == {"ve": tables, "unet": 2, "ve+unet": tables + 2}


def test_lever_gpt_refuses_caches():
    config = small_config()
    model = LeverGPT(config, value_embeddings=True)
    idx, _ = some_ids(config)
    with pytest.raises(ValueError, match="caches=None"):
        model(idx, caches=GPT(config).new_caches(2))
    with pytest.raises(ValueError, match="trained and scored only"):
        model.new_caches(2)
    with pytest.raises(TypeError, match="True or False"):
        LeverGPT(config, value_embeddings=1)
