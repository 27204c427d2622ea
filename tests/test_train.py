"""Tests for tinygpt.train: the config, batches, the schedule, the optimizer's groups, evaluation
and the training loop (checked against torch's own AdamW, schedulers and cross-entropy)."""

from __future__ import annotations

import math
import platform
import random
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.checkpoint import load_checkpoint
from tinygpt.checkpoint.run_state import TrainingDivergedError
from tinygpt.cli import main
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.runtime import resolve_device
from tinygpt.tokenizer import CharTokenizer
from tinygpt.train import (
    configure_optimizer,
    estimate_loss,
    get_batch,
    lr_at,
    train,
)

TEXT = "the quick brown fox jumps over the lazy dog; a lazy dog sleeps in the sun. " * 30
TOK = CharTokenizer.from_text(TEXT)
IDS = torch.tensor(TOK.encode(TEXT))
TRAIN, VAL = IDS[:2000], IDS[2000:]
MODEL = GPTConfig(vocab_size=TOK.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=16,
                  dropout=0.1)
TINY = TrainConfig(batch_size=4, max_iters=6, warmup_iters=2, lr_decay_iters=6, eval_interval=3,
                   eval_iters=2, grad_accum_steps=2, learning_rate=3e-3)


def without_timing(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in history]


# --- TrainConfig ---------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, error", [
    ("batch_size", 0, ValueError), ("max_iters", 1.5, TypeError), ("warmup_iters", -1, ValueError),
    ("learning_rate", 0.0, ValueError), ("learning_rate", float("nan"), ValueError),
    ("min_lr", 1.0, ValueError), ("beta2", 1.0, ValueError), ("weight_decay", "0.1", TypeError),
    ("grad_clip", -1.0, ValueError), ("lr_decay_iters", 0, ValueError),
    ("device", "gpu", ValueError), ("grad_accum_steps", True, TypeError),
    ("dtype", "float16", ValueError), ("dtype", "fp32", ValueError),
])
def test_config_rejects_bad_values_naming_the_field(field, value, error):
    with pytest.raises(error, match=field):
        TrainConfig(**{field: value})


# --- get_batch -----------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(N=st.integers(2, 60), B=st.integers(1, 5), T=st.integers(1, 10), seed=st.integers(0, 99))
def test_get_batch_gives_shifted_windows_of_the_stream(N, B, T, seed):
    if N < T + 1:
        with pytest.raises(ValueError, match="block_size"):
            get_batch(torch.arange(N), B, T)
        return
    data = torch.arange(N) * 7 % 101  # distinct values, so a window is found by its first token
    x, y = get_batch(data, B, T, torch.Generator().manual_seed(seed))
    assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.int64
    for row_x, row_y in zip(x, y, strict=True):
        i = int((data == row_x[0]).nonzero())
        assert i + T + 1 <= N
        assert torch.equal(row_x, data[i:i + T]) and torch.equal(row_y, data[i + 1:i + T + 1])
    x2, y2 = get_batch(data, B, T, torch.Generator().manual_seed(seed))
    assert torch.equal(x, x2) and torch.equal(y, y2)


def test_get_batch_reaches_every_start_and_rejects_bad_data():
    data = torch.arange(10)
    g = torch.Generator().manual_seed(0)
    starts = {int(x[0]) for x in get_batch(data, 500, 4, g)[0]}
    assert starts == set(range(6))  # 0 .. N - T - 1
    with pytest.raises(TypeError, match="1-D integer"):
        get_batch(torch.zeros(10), 2, 4)
    with pytest.raises(TypeError, match="1-D integer"):
        get_batch(torch.zeros(2, 10, dtype=torch.long), 2, 4)


# --- lr_at ---------------------------------------------------------------------------------------

def test_schedule_warms_up_linearly_then_follows_torchs_cosine_to_min_lr():
    cfg = TrainConfig(learning_rate=1e-2, min_lr=1e-3, warmup_iters=10, max_iters=110)
    assert [lr_at(s, cfg) for s in range(10)] == pytest.approx([1e-3 * (s + 1) for s in range(10)])
    # torch's CosineAnnealingLR over the decay phase is the reference
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100, eta_min=1e-3)
    for s in range(10, 111):
        assert lr_at(s, cfg) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9, abs=1e-12)
        opt.step()
        sched.step()
    assert lr_at(60, cfg) == pytest.approx((1e-2 + 1e-3) / 2)
    assert lr_at(110, cfg) == lr_at(500, cfg) == 1e-3
    short = replace(cfg, lr_decay_iters=50)
    assert lr_at(50, short) == 1e-3 and lr_at(49, short) > 1e-3
    with pytest.raises(ValueError, match="step"):
        lr_at(-1, cfg)


@pytest.mark.parametrize("cooldown", [0.2, 0.5, 1.0])
def test_wsd_holds_the_rate_then_falls_in_a_straight_line_to_min_lr(cooldown):
    cfg = TrainConfig(learning_rate=1e-2, min_lr=1e-3, warmup_iters=10, max_iters=110,
                      schedule="wsd", cooldown_fraction=cooldown)
    cosine = replace(cfg, schedule="cosine")
    assert [lr_at(s, cfg) for s in range(10)] == [lr_at(s, cosine) for s in range(10)]
    start = 10 + round(100 * (1 - cooldown))  # the first step of the cool-down
    assert [lr_at(s, cfg) for s in range(10, start + 1)] == pytest.approx([1e-2] * (start - 9))
    for s in range(start, 111):  # the line through (start, 1e-2) and (110, 1e-3)
        expected = 1e-3 + (1e-2 - 1e-3) * (110 - s) / (110 - start)
        assert lr_at(s, cfg) == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert lr_at(110, cfg) == lr_at(400, cfg) == 1e-3
    short = replace(cfg, lr_decay_iters=60)  # the cool-down ends at lr_decay_iters
    assert lr_at(59, short) > 1e-3 and lr_at(60, short) == lr_at(100, short) == 1e-3


@pytest.mark.parametrize(("field", "value"), [("schedule", "linear"),
                                              ("cooldown_fraction", 0.0),
                                              ("cooldown_fraction", 1.5),
                                              ("adamw_lr_scale", 0.0),
                                              ("adamw_lr_scale", -1.0)])
def test_schedule_and_rate_scale_settings_out_of_range_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


# --- configure_optimizer -------------------------------------------------------------------------

@pytest.mark.parametrize("tie", [True, False])
def test_optimizer_decays_exactly_the_matrices(tie):
    torch.manual_seed(0)
    model = GPT(replace(MODEL, tie_weights=tie))
    opt = configure_optimizer(model, TrainConfig(weight_decay=0.5, learning_rate=0.1))
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is True  # on CPU
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.5 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in decay["params"]} == {
        n for n, p in model.named_parameters() if p.dim() >= 2}
    grouped = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())  # each one exactly once
    # With zero gradients Adam's step is 0, so only the decoupled decay moves a parameter.
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        factor = 1 - 0.1 * 0.5 if p.dim() >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor)


@pytest.mark.parametrize("tie", [True, False])
def test_optimizer_decays_the_parameters_its_docstring_names(tie):
    """configure_optimizer's docstring names what it decays in a GPT: wte (lm_head's when tied),
    wpe and the c_attn, c_fc and c_proj weights; never a bias or a gain (QK-norm's included)."""
    model = GPT(replace(MODEL, tie_weights=tie, qk_norm=True))
    decay, no_decay = configure_optimizer(model, TrainConfig()).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)].rsplit(".", 2)[-2] for p in decay["params"]}  # the layers' names
    assert decayed == {"wte", "wpe", "c_attn", "c_fc", "c_proj"} | (set() if tie else {"lm_head"})
    kept = {names[id(p)] for p in no_decay["params"]}
    assert all(n.endswith(".bias") or n.rsplit(".", 2)[-2] in
               {"ln_1", "ln_2", "ln_f", "q_norm", "k_norm"} for n in kept), kept
    assert any("q_norm" in n for n in kept)


def test_fused_optimizer_takes_the_per_tensor_loops_steps():
    """The fused kernel is an implementation detail: five steps of real gradients land where
    torch's plain per-tensor AdamW (same groups, same hyper-parameters) lands, to rounding."""
    torch.manual_seed(0)
    model = GPT(replace(MODEL, dropout=0.0))  # no dropout: both see the same function
    twin = GPT(model.config)
    twin.load_state_dict(model.state_dict())
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = TrainConfig(weight_decay=0.1, learning_rate=3e-3, beta2=0.95)
    fused = configure_optimizer(model, cfg)
    plain = configure_optimizer(twin, cfg)
    for group in plain.param_groups:
        group["fused"], group["foreach"] = False, False
    x, y = get_batch(TRAIN, 4, MODEL.block_size, torch.Generator().manual_seed(1))
    for _ in range(5):
        for m, opt in ((model, fused), (twin, plain)):
            opt.zero_grad()
            m(x, y)[1].backward()
            opt.step()
    moved = 0.0
    for (n, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        # atol: Adam divides by sqrt(v), so a key bias's gradient, zero up to rounding noise,
        # moves by the noise's sign; 1e-5 is under 0.1% of the 0.015 the steps may move
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5, msg=n)
        moved = max(moved, (p - start[n]).abs().max().item())
    assert moved > 1e-3  # the steps did move the weights


# --- estimate_loss -------------------------------------------------------------------------------

def test_estimate_loss_is_the_mean_cross_entropy_in_eval_mode():
    torch.manual_seed(0)
    model = GPT(MODEL).train()
    cfg = TrainConfig(batch_size=3, eval_iters=4)
    got = estimate_loss(model, {"val": VAL}, cfg, torch.Generator().manual_seed(5))
    assert model.training  # the mode is restored
    g, losses = torch.Generator().manual_seed(5), []
    model.eval()
    with torch.no_grad():
        for _ in range(4):
            x, y = get_batch(VAL, 3, MODEL.block_size, g)
            logits = model(x)
            losses.append(F.cross_entropy(logits.flatten(0, 1), y.flatten()).item())
    assert got["val"] == pytest.approx(sum(losses) / 4, rel=1e-6)
    assert all(p.grad is None for p in model.parameters())


# --- train ---------------------------------------------------------------------------------------

def test_training_lowers_the_loss_and_records_its_history():
    cfg = TrainConfig(batch_size=8, max_iters=15, warmup_iters=3, eval_interval=5, eval_iters=4,
                      learning_rate=2e-2)
    history = train(replace(MODEL, dropout=0.0), cfg, TRAIN, VAL, progress=False)
    first, last = history[0], history[-1]
    assert first["step"] == 0 and first["val_loss"] == pytest.approx(math.log(TOK.vocab_size),
                                                                      rel=0.05)
    assert [r["step"] for r in history] == list(range(16))
    assert [r["step"] for r in history if "val_loss" in r] == [0, 5, 10, 15]
    assert [r["lr"] for r in history[1:]] == [lr_at(s, cfg) for s in range(15)]
    assert all(r["tokens_per_s"] > 0 for r in history[1:])
    assert last["val_loss"] < first["val_loss"] - 0.5


def test_gradient_accumulation_equals_one_big_batch():
    model_cfg = replace(MODEL, dropout=0.0)
    cfg = TrainConfig(batch_size=8, max_iters=1, warmup_iters=0, grad_clip=0.0, eval_iters=1)
    big, small = GPT(model_cfg), GPT(model_cfg)
    small.load_state_dict(big.state_dict())
    h_big = train(model_cfg, cfg, TRAIN, VAL, model=big, progress=False)
    h_small = train(model_cfg, replace(cfg, batch_size=4, grad_accum_steps=2), TRAIN, VAL,
                    model=small, progress=False)
    assert h_small[1]["loss"] == pytest.approx(h_big[1]["loss"], rel=1e-5)
    for (name, a), b in zip(big.named_parameters(), small.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


def test_a_tokenizer_larger_than_the_model_is_refused_before_training(tmp_path):
    """Refused by train before any step (naming both sizes), not by its first save later."""
    larger = CharTokenizer([*TOK.chars, *"0123456789"])
    message = (f"has {TOK.vocab_size + 10} tokens but the model's vocab_size is "
               f"{TOK.vocab_size}")
    with pytest.raises(ValueError, match=message):
        train(MODEL, TINY, TRAIN, VAL, out_dir=tmp_path / "run", tokenizer=larger,
              progress=False)
    assert not (tmp_path / "run").exists()
    with pytest.raises(TypeError, match="tokenizer must be a CharTokenizer, a BPETokenizer"):
        train(MODEL, TINY, TRAIN, VAL, tokenizer="abc", progress=False)


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    straight = train(MODEL, TINY, TRAIN, VAL, out_dir=tmp_path / "a", tokenizer=TOK,
                     progress=False)
    train(MODEL, replace(TINY, max_iters=3), TRAIN, VAL, out_dir=tmp_path / "b", tokenizer=TOK,
          progress=False)
    torch.manual_seed(12345)  # a fresh process would start from other RNG states
    random.seed(12345)
    resumed = train(MODEL, TINY, TRAIN, VAL, out_dir=tmp_path / "b", resume=True, progress=False)
    assert without_timing(resumed) == without_timing(straight)
    a, b = load_checkpoint(tmp_path / "a"), load_checkpoint(tmp_path / "b")
    assert a.step == b.step == 6 and b.tokenizer.chars == TOK.chars
    for (name, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values(),
                            strict=True):
        assert torch.equal(p, q), name
    for i, state in a.optimizer_state["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b.optimizer_state["state"][i][key]), (i, key)


def test_resume_errors(tmp_path):
    with pytest.raises(ValueError, match="out_dir"):
        train(MODEL, TINY, TRAIN, VAL, resume=True, progress=False)
    train(MODEL, replace(TINY, max_iters=1), TRAIN, VAL, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="model config"):
        train(replace(MODEL, n_embd=32), TINY, TRAIN, VAL, out_dir=tmp_path, resume=True,
              progress=False)


def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = TrainConfig(batch_size=4, max_iters=20, warmup_iters=0, learning_rate=1e30,
                      grad_clip=0.0, save_every=1, eval_iters=1)
    # the weights after step 1 are finite but give a NaN loss: they are not saved (a checkpoint
    # of them would sample NaNs); the run stops there, keeping what was saved before: nothing
    with pytest.raises(TrainingDivergedError, match=r"after step 1 .*not saved and no checkpoint"):
        train(MODEL, cfg, TRAIN, VAL, out_dir=tmp_path, progress=False)
    assert not (tmp_path / "checkpoint.json").exists()


def test_callback_can_stop_training_and_the_stop_is_saved(tmp_path):
    seen = []

    def stop_at_two(record, model):
        seen.append(record["step"])
        return record["step"] == 2

    history = train(MODEL, TINY, TRAIN, VAL, out_dir=tmp_path, callback=stop_at_two,
                    progress=False)
    assert seen == [1, 2] and history[-1]["step"] == 2 and load_checkpoint(tmp_path).step == 2


@pytest.mark.parametrize("train_data, error, match", [
    (IDS[:16], ValueError, "holds 16 tokens.*at least 17"),
    (torch.zeros(100), TypeError, "integer"),
    (torch.full((100,), TOK.vocab_size), ValueError, "vocabulary"),
    ("not tokens", TypeError, "token ids"),
])
def test_bad_training_data_is_a_clear_error(train_data, error, match):
    with pytest.raises(error, match=match):
        train(MODEL, TINY, train_data, VAL, progress=False)


@pytest.mark.skipif(torch.cuda.is_available() and torch.backends.mps.is_available(),
                    reason="both accelerators exist here, so neither request can fail")
def test_an_unavailable_accelerator_is_a_clear_error():
    missing = [name for name, ok in (("cuda", torch.cuda.is_available()),
                                     ("mps", torch.backends.mps.is_available())) if not ok]
    for name in missing:
        with pytest.raises(ValueError, match=f"device '{name}' was asked for, but .* not "
                                             "available here"):
            resolve_device(name)
    assert resolve_device("cpu") == torch.device("cpu")


# --- keep_freed_memory ---------------------------------------------------------------------------

_FAULTS = """
import resource, sys, torch
from tinygpt.model import GPT
from tinygpt.config import GPTConfig
from tinygpt.train import configure_optimizer
from tinygpt.config import TrainConfig
from tinygpt.runtime import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
torch.manual_seed(0)
model = GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=128))
opt = configure_optimizer(model, TrainConfig())
x, y = torch.randint(65, (12, 64)), torch.randint(65, (12, 64))
for step in range(30):
    if step == 10:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(x, y)[1].backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(kept, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


@pytest.mark.slow
@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="keep_freed_memory changes glibc's malloc only")
def test_keep_freed_memory_ends_the_page_faults_of_each_step():
    """Training steps of a small GPT: by default each step page-faults fresh memory for its
    activations (hundreds of faults); after keep_freed_memory() it reuses what it freed."""
    def faults_per_step(mode: str) -> tuple[str, float]:
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True,
                             text=True, check=True)
        kept, faults = out.stdout.split()
        return kept, float(faults)

    kept, tuned = faults_per_step("keep")
    # glibc's own heuristics (its mmap threshold grows after a free) sometimes spare a default
    # run most of its faults (17.6 per step once, on a clean-clone CI run): the cost is measured
    # as the worst of three default runs
    default = max(faults_per_step("default")[1] for _ in range(3))
    assert kept == "True"
    assert default > 100, default  # the cost this setting removes, present here
    # Fault counts are noisy: measured here, 270 to 870 per step by default and 0 to 45 kept, the
    # kept ones highest with torch's scalar kernels (ATEN_CPU_CAPABILITY=default); a factor of 4
    # still separates the two with room to spare.
    assert tuned < default / 4, (tuned, default)


def test_train_on_cpu_keeps_freed_memory(monkeypatch):
    import tinygpt.train as train_module
    calls = []
    monkeypatch.setattr(train_module, "keep_freed_memory", lambda: calls.append(1) or True)
    train(MODEL, replace(TINY, max_iters=1), TRAIN, VAL, progress=False)
    assert calls == [1]


# --- resume ---------------------------------------------------------------------------------------
# The resume tests' run (_R): ids mod 32, a warm-up of one step, then a cosine over the rest, so
# every later step's lr depends on max_iters.
IDS_R = torch.tensor([ord(c) % 32 for c in TEXT])
TRAIN_R, VAL_R = IDS_R[:2000], IDS_R[2000:]
MODEL_R = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16)
CFG_R = TrainConfig(batch_size=4, max_iters=6, warmup_iters=1, learning_rate=3e-3, min_lr=3e-4,
                    eval_interval=3, eval_iters=2)


def test_an_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path):
    straight = train(MODEL_R, CFG_R, TRAIN_R, VAL_R, out_dir=tmp_path / "a", progress=False)
    stopped = train(MODEL_R, CFG_R, TRAIN_R, VAL_R, out_dir=tmp_path / "b", progress=False,
                    callback=lambda record, model: record["step"] == 3)  # interrupted at step 3
    assert stopped[-1]["step"] == 3 and load_checkpoint(tmp_path / "b").step == 3
    resumed = train(MODEL_R, CFG_R, TRAIN_R, VAL_R, out_dir=tmp_path / "b", resume=True,
                    progress=False)
    assert without_timing(resumed) == without_timing(straight)


def test_resume_refuses_to_stretch_a_finished_schedule(tmp_path):
    train(MODEL_R, CFG_R, TRAIN_R, VAL_R, out_dir=tmp_path, progress=False)
    longer = replace(CFG_R, max_iters=12)
    assert lr_at(6, longer) > lr_at(5, CFG_R)  # what stretching would do: the rate goes back up
    with pytest.raises(ValueError) as err:
        train(MODEL_R, longer, TRAIN_R, VAL_R, out_dir=tmp_path, resume=True, progress=False)
    message = str(err.value)
    assert "max_iters=12 (the checkpoint's: 6)" in message
    assert f"from {lr_at(5, CFG_R):.1e} at step 6 to {lr_at(6, longer):.1e} at step 7" in message
    assert "new run" in message and "\n" not in message
    assert load_checkpoint(tmp_path).step == 6  # nothing was trained or written


def test_resume_refuses_a_shorter_run_continued_on_a_longer_schedule(tmp_path):
    # steps 1-3 of a 3-step run follow another cosine than steps 1-3 of a 6-step run
    train(MODEL_R, replace(CFG_R, max_iters=3), TRAIN_R, VAL_R, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"max_iters=6 \(the checkpoint's: 3\).* step 3 was"):
        train(MODEL_R, CFG_R, TRAIN_R, VAL_R, out_dir=tmp_path, resume=True, progress=False)


@pytest.mark.parametrize("field, value", [("learning_rate", 1e-3), ("min_lr", 1e-4),
                                          ("warmup_iters", 2), ("lr_decay_iters", 4),
                                          ("schedule", "wsd")])
def test_resume_names_the_schedule_field_that_changed(tmp_path, field, value):
    train(MODEL_R, CFG_R, TRAIN_R, VAL_R, out_dir=tmp_path, progress=False,
          callback=lambda record, model: record["step"] == 4)
    with pytest.raises(ValueError, match=f"{field}={value} \\(the checkpoint's: "):
        train(MODEL_R, replace(CFG_R, **{field: value}), TRAIN_R, VAL_R, out_dir=tmp_path,
              resume=True, progress=False)


def test_resume_refuses_another_rate_for_muons_adamw_part(tmp_path):
    muon = replace(CFG_R, optimizer="muon", adamw_lr_scale=2.0)
    train(MODEL_R, muon, TRAIN_R, VAL_R, out_dir=tmp_path, progress=False,
          callback=lambda record, model: record["step"] == 3)
    with pytest.raises(ValueError, match=r"adamw_lr_scale=1.0 \(the checkpoint's: 2.0\)"):
        train(MODEL_R, replace(muon, adamw_lr_scale=1.0), TRAIN_R, VAL_R, out_dir=tmp_path,
              resume=True, progress=False)
    assert load_checkpoint(tmp_path).step == 3  # nothing was trained or written


def test_resume_allows_settings_that_leave_the_steps_taken_unchanged(tmp_path):
    # during warm-up the rate does not depend on max_iters: a longer run is still the same run
    warm = replace(CFG_R, warmup_iters=10, max_iters=3)
    train(MODEL_R, warm, TRAIN_R, VAL_R, out_dir=tmp_path / "b", progress=False)
    resumed = train(MODEL_R, replace(warm, max_iters=6), TRAIN_R, VAL_R, out_dir=tmp_path / "b",
                    resume=True, progress=False)
    straight = train(MODEL_R, replace(warm, max_iters=6), TRAIN_R, VAL_R, progress=False)
    assert without_timing(resumed) == without_timing(straight)


def test_cli_resume_with_a_larger_max_iters_is_a_clear_one_line_error(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    base = ["train", "--data", str(corpus), "--out", str(tmp_path / "run"), "--n-layer", "1",
            "--n-head", "2", "--n-embd", "16", "--block-size", "8", "--batch-size", "4",
            "--eval-iters", "1", "--warmup-iters", "1", "--quiet"]
    assert main(base + ["--max-iters", "4"]) == 0
    capsys.readouterr()
    code = main(base + ["--resume", "--max-iters", "8"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("tinygpt: error: ") and "Traceback" not in err
    assert "max_iters=8 (the checkpoint's: 4)" in err
    assert load_checkpoint(tmp_path / "run").step == 4
