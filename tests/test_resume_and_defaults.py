"""Rules that chapters 8-10 state: resuming never stretches a learning-rate schedule, bf16 is
refused on GPUs that only emulate it, and ``generate``'s default ``crop_to`` rebuilds the key/value
cache every ``block_size // 2`` tokens or so, not every other token."""

from __future__ import annotations

import warnings
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import tinygpt.sample as sample_module
from tinygpt.checkpoint import load_checkpoint
from tinygpt.cli import main
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.runtime import autocast
from tinygpt.sample import generate
from tinygpt.train import lr_at, train

TEXT = "the quick brown fox jumps over the lazy dog; a lazy dog sleeps in the sun. " * 30
IDS = torch.tensor([ord(c) % 32 for c in TEXT])
TRAIN, VAL = IDS[:2000], IDS[2000:]
MODEL = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16)
# warm-up of one step, then a cosine over the rest: every later step's lr depends on max_iters
CFG = TrainConfig(batch_size=4, max_iters=6, warmup_iters=1, learning_rate=3e-3, min_lr=3e-4,
                  eval_interval=3, eval_iters=2)


def without_timing(history):
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in history]


# --- resume ---------------------------------------------------------------------------------------

def test_an_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path):
    straight = train(MODEL, CFG, TRAIN, VAL, out_dir=tmp_path / "a", progress=False)
    stopped = train(MODEL, CFG, TRAIN, VAL, out_dir=tmp_path / "b", progress=False,
                    callback=lambda record, model: record["step"] == 3)  # interrupted at step 3
    assert stopped[-1]["step"] == 3 and load_checkpoint(tmp_path / "b").step == 3
    resumed = train(MODEL, CFG, TRAIN, VAL, out_dir=tmp_path / "b", resume=True, progress=False)
    assert without_timing(resumed) == without_timing(straight)


def test_resume_refuses_to_stretch_a_finished_schedule(tmp_path):
    train(MODEL, CFG, TRAIN, VAL, out_dir=tmp_path, progress=False)
    longer = replace(CFG, max_iters=12)
    assert lr_at(6, longer) > lr_at(5, CFG)  # what stretching would do: the rate goes back up
    with pytest.raises(ValueError) as err:
        train(MODEL, longer, TRAIN, VAL, out_dir=tmp_path, resume=True, progress=False)
    message = str(err.value)
    assert "max_iters=12 (the checkpoint's: 6)" in message
    assert f"from {lr_at(5, CFG):.1e} at step 6 to {lr_at(6, longer):.1e} at step 7" in message
    assert "new run" in message and "\n" not in message
    assert load_checkpoint(tmp_path).step == 6  # nothing was trained or written


def test_resume_refuses_a_shorter_run_continued_on_a_longer_schedule(tmp_path):
    # steps 1-3 of a 3-step run follow another cosine than steps 1-3 of a 6-step run
    train(MODEL, replace(CFG, max_iters=3), TRAIN, VAL, out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"max_iters=6 \(the checkpoint's: 3\).* step 3 was"):
        train(MODEL, CFG, TRAIN, VAL, out_dir=tmp_path, resume=True, progress=False)


@pytest.mark.parametrize("field, value", [("learning_rate", 1e-3), ("min_lr", 1e-4),
                                          ("warmup_iters", 2), ("lr_decay_iters", 4)])
def test_resume_names_the_schedule_field_that_changed(tmp_path, field, value):
    train(MODEL, CFG, TRAIN, VAL, out_dir=tmp_path, progress=False,
          callback=lambda record, model: record["step"] == 4)
    with pytest.raises(ValueError, match=f"{field}={value} \\(the checkpoint's: "):
        train(MODEL, replace(CFG, **{field: value}), TRAIN, VAL, out_dir=tmp_path, resume=True,
              progress=False)


def test_resume_allows_settings_that_leave_the_steps_taken_unchanged(tmp_path):
    # during warm-up the rate does not depend on max_iters: a longer run is still the same run
    warm = replace(CFG, warmup_iters=10, max_iters=3)
    train(MODEL, warm, TRAIN, VAL, out_dir=tmp_path / "b", progress=False)
    resumed = train(MODEL, replace(warm, max_iters=6), TRAIN, VAL, out_dir=tmp_path / "b",
                    resume=True, progress=False)
    straight = train(MODEL, replace(warm, max_iters=6), TRAIN, VAL, progress=False)
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


# --- bf16 needs native support on CUDA ------------------------------------------------------------

def fake_gpu(monkeypatch, major: int) -> None:
    """Make torch.cuda report one GPU of compute capability ``major``.x that can emulate bf16."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(major=major, minor=5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"FakeGPU sm_{major}5")
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True,
                        raising=False)


def test_bf16_is_refused_on_a_gpu_that_only_emulates_it(monkeypatch):
    fake_gpu(monkeypatch, major=7)  # Volta/Turing: bf16 tensors work, emulated
    assert torch.cuda.is_bf16_supported()  # torch's default counts the emulation
    assert not torch.cuda.is_bf16_supported(including_emulation=False)
    with pytest.raises(ValueError, match="FakeGPU sm_75 has no native bfloat16"):
        autocast(torch.device("cuda"), "bfloat16")
    autocast(torch.device("cuda"), "float32")  # float32 needs nothing


def test_bf16_is_accepted_on_an_ampere_gpu(monkeypatch):
    fake_gpu(monkeypatch, major=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a CPU-only torch warns that CUDA autocast is off
        context = autocast(torch.device("cuda"), "bfloat16")
    assert isinstance(context, torch.autocast)


# --- generate: how often the cache is rebuilt past the context ------------------------------------

def count_rebuilds(monkeypatch, model: GPT, n: int,
                   crop_to: int | None) -> tuple[int, torch.Tensor]:
    real, rebuilds = sample_module.context_schedule, []

    def counting(*args):
        start, rebuilt = real(*args)
        rebuilds.append(rebuilt)
        return start, rebuilt

    monkeypatch.setattr(sample_module, "context_schedule", counting)
    idx = torch.zeros(1, 1, dtype=torch.long)
    out = generate(model, idx, n, temperature=0, crop_to=crop_to)
    monkeypatch.setattr(sample_module, "context_schedule", real)
    return sum(rebuilds), out


def test_the_default_crop_to_rebuilds_every_half_context(monkeypatch):
    torch.manual_seed(0)
    T_max = 16
    model = GPT(GPTConfig(vocab_size=11, block_size=T_max, n_layer=1, n_head=2, n_embd=8)).eval()
    period = T_max - T_max // 2 + 1  # tokens between rebuilds with crop_to = T_max // 2: 9
    n = T_max + 9 * period  # a 1-token prompt: the context is full after T_max - 1 new tokens
    default, out_default = count_rebuilds(monkeypatch, model, n, None)
    _, out_half = count_rebuilds(monkeypatch, model, n, T_max // 2)
    old, _ = count_rebuilds(monkeypatch, model, n, T_max - 1)
    assert torch.equal(out_default, out_half)  # the default is crop_to = block_size // 2
    assert default == 9  # at n = 17, 26, ..., 89 tokens: one per period past the context
    assert old == len(range(T_max + 1, n + 1, 2)) == 41  # crop_to = T_max - 1: every other token
