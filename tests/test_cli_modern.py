"""The modern GPT's switches on the command line: options made from the new GPTConfig and
TrainConfig fields train a Llama-style model with Muon, resume it, sample from it, and refuse bad
values with one-line errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import run_cli as run

import tinygpt
from tinygpt.checkpoint import load_checkpoint
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.sample import generate

TEXT = "".join(f"the {w} saw {n} {v} and more.\n" for w, v, n in zip(
    ["cat", "dog", "fox", "owl", "ant", "bee"] * 6, ["trees", "hills", "birds"] * 12, range(36)))
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "8",
        "--batch-size", "4", "--eval-interval", "3", "--eval-iters", "2", "--warmup-iters", "2",
        "--quiet"]
MODERN = ["--positional", "rope", "--rope-theta", "500", "--activation", "swiglu",
          "--norm", "rmsnorm", "--no-bias", "--qk-norm", "--zero-init-proj", "--no-tie-weights",
          "--optimizer", "muon"]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_the_modern_switches_train_resume_and_sample_from_the_command_line(
        capsys, corpus, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out, steps in ((a, 6), (b, 3)):  # b stops half way (the warm-up is 2 steps: the first
        # 3 learning rates do not depend on max_iters)
        code, _, err = run(capsys, "train", "--data", corpus, "--out", out, *TINY, *MODERN,
                           "--max-iters", steps)
        assert code == 0, err
    ckpt = load_checkpoint(b)
    assert dataclasses.asdict(ckpt.model_config) == dataclasses.asdict(GPTConfig(
        vocab_size=len(set(TEXT)), block_size=8, n_layer=1, n_head=2, n_embd=16,
        positional="rope", rope_theta=500.0, activation="swiglu", norm="rmsnorm", bias=False,
        qk_norm=True, zero_init_proj=True, tie_weights=False))
    assert ckpt.train_config == TrainConfig(
        batch_size=4, max_iters=3, eval_interval=3, eval_iters=2, warmup_iters=2,
        optimizer="muon")
    torch.manual_seed(999)  # another state of the global RNG, as in a new process
    code, _, err = run(capsys, "train", "--data", corpus, "--out", b, "--resume",
                       "--max-iters", 6, "--quiet")
    assert code == 0, err
    ours, theirs = load_checkpoint(a), load_checkpoint(b)
    assert ours.step == theirs.step == 6 and ours.train_config.optimizer == "muon"
    for name, t in ours.model.state_dict().items():
        assert torch.equal(t, theirs.model.state_dict()[name]), name

    model, tok = tinygpt.load(b)
    assert model.transformer.h[0].attn.rope is not None
    idx = torch.tensor([tok.encode("the ")])
    code, stdout, _ = run(capsys, "sample", "--out", b, "--prompt", "the ",
                          "--max-new-tokens", 12, "--temperature", 0)
    greedy = generate(model, idx, 12, temperature=0)
    assert code == 0 and stdout == tok.decode(greedy[0].tolist()) + "\n"


@pytest.mark.parametrize(("extra", "words"), [
    (["--positional", "rope", "--n-embd", "18"], ["head size", "even", "--positional"]),
    (["--rope-theta", "0.5"], ["rope_theta", "--rope-theta"]),
    (["--optimizer", "sgd"], ["invalid choice: 'sgd'", "'adamw', 'muon'"]),
    (["--activation", "geglu"], ["invalid choice: 'geglu'", "'swiglu'", "'relu2'"]),
])
def test_bad_modern_options_are_one_line_errors(capsys, corpus, tmp_path, extra, words):
    code, _, err = run(capsys, "train", "--data", corpus, "--out", tmp_path / "run",
                       *TINY, "--max-iters", "2", *extra)
    assert code == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    for word in words:
        assert word in last, (word, last)
