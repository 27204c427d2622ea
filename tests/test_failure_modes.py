"""Issue #35 item 11, the rest: many small shards in linear time (the progress file is no longer
rewritten for every shard, and a resume stays exact), the re-run check, and clear messages."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import tinygpt.prepare as prepare_run
from tinygpt.prepare.documents import Options
from tinygpt.shards import PROGRESS
from tinygpt.tokenizer import EOT

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog;", "sun,", "moon"]
TINY_SHARDS = Options(tokenizer="char", val_fraction=0.25, seed=3, shard_tokens=50)


def make_corpus(folder: Path, files: int = 4, docs: int = 4, words: int = 120) -> Path:
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        texts = [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(docs)]
        (folder / f"doc{f}.txt").write_text(EOT.join(texts), encoding="utf-8")
    return folder


def folder_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_many_small_shards_do_not_rewrite_the_progress_file_for_each(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_run.time, "monotonic", lambda: 0.0)  # a fast machine
    saves = []
    real = prepare_run.save_json
    monkeypatch.setattr(prepare_run, "save_json",
                        lambda out, name, m: saves.append(name) or real(out, name, m))
    manifest = prepare_run.write_shards(make_corpus(tmp_path / "in"), tmp_path / "out",
                                        TINY_SHARDS, workers=1)
    shards = sum(len(v) for v in manifest["shards"].values())
    assert shards > 150
    # was one save a shard (quadratic bytes); now after 1, 2, 4, 8... shards
    assert saves.count(PROGRESS) <= 12, (saves.count(PROGRESS), shards)


@pytest.mark.parametrize("killed_after", [5, 37])
def test_a_run_killed_between_progress_saves_resumes_exactly(tmp_path, monkeypatch, killed_after):
    monkeypatch.setattr(prepare_run.time, "monotonic", lambda: 0.0)  # a fast machine
    corpus = make_corpus(tmp_path / "in")
    prepare_run.write_shards(corpus, tmp_path / "straight", TINY_SHARDS, workers=1)
    real, calls = prepare_run._write_shard, []

    def dies(out, name, tokens):
        if len(calls) == killed_after:
            raise KeyboardInterrupt
        calls.append(name)
        return real(out, name, tokens)

    monkeypatch.setattr(prepare_run, "_write_shard", dies)
    with pytest.raises(KeyboardInterrupt):
        prepare_run.write_shards(corpus, tmp_path / "killed", TINY_SHARDS, workers=1)
    rewritten: list[str] = []
    monkeypatch.setattr(prepare_run, "_write_shard",
                        lambda out, name, tokens: rewritten.append(name) or real(out, name, tokens))
    prepare_run.write_shards(corpus, tmp_path / "killed", TINY_SHARDS, workers=1)
    assert set(calls) & set(rewritten) != set(calls)  # some finished shards were kept
    assert folder_bytes(tmp_path / "killed") == folder_bytes(tmp_path / "straight")


def test_an_input_changed_with_the_same_size_and_time_is_prepared_again(tmp_path):
    import os

    corpus, out = make_corpus(tmp_path / "in"), tmp_path / "out"
    first = prepare_run.write_shards(corpus, out, TINY_SHARDS, workers=1)
    path = corpus / "doc0.txt"
    stat = path.stat()
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("fox", "cat"), encoding="utf-8")  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same time
    assert path.stat().st_size == stat.st_size
    with pytest.raises(ValueError, match="other inputs or options"):  # was: the old shards
        prepare_run.write_shards(corpus, out, TINY_SHARDS, workers=1)
    again = prepare_run.write_shards(corpus, out, TINY_SHARDS, workers=1, overwrite=True)
    assert again["shards"] != first["shards"]


TEXT = "".join(f"{w} the {v} was {n} and more zebra.\n" for w, v, n in zip(
    ["first", "second", "third", "fourth", "fifth", "sixth"] * 5,
    ["cat", "dog", "fox", "owl", "ant", "bee"] * 5, range(30), strict=False))
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "2", "--max-iters", "5", "--eval-interval", "5", "--eval-iters", "1",
        "--quiet"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    from tinygpt.cli import main

    folder = tmp_path_factory.mktemp("run")
    (folder / "small.txt").write_text(TEXT, encoding="utf-8")
    assert main(["train", "--data", str(folder / "small.txt"), "--out", str(folder / "out"),
                 *TINY]) == 0
    return folder / "out"


def test_sample_warns_when_the_checkpoints_losses_say_the_run_diverged(capsys, trained,
                                                                       tmp_path):
    import shutil

    from conftest import rewrite_manifest
    from conftest import run_cli as run

    code, _, err = run(capsys, "sample", "--out", trained, "--max-new-tokens", "5")
    assert code == 0 and "diverged" not in err, err
    diverged = tmp_path / "diverged"
    shutil.copytree(trained, diverged)

    def blow_up(meta):
        meta["history"][-1].update(loss=2.9e9, val_loss=1.6e7, train_loss=1.6e7)

    rewrite_manifest(diverged, blow_up)
    code, _, err = run(capsys, "sample", "--out", diverged, "--max-new-tokens", "5")
    assert code == 0
    assert "tinygpt: warning:" in err and "diverged" in err and "2.9e+09" in err, err


def test_a_shard_truncated_during_training_is_a_clear_error_not_sigbus(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    prepare_run.write_shards(make_corpus(tmp_path / "in"), out,
                             Options(tokenizer="char", val_fraction=0.25, seed=3), workers=1)
    script = f"""
import os, sys, torch
from tinygpt.shards import ShardError, TokenShards
shards = TokenShards({str(out)!r}, "train")
shards.get_batch(4, 8)
os.truncate({str(out / "train_000000.bin")!r}, 2)  # another program truncates it
try:
    for _ in range(50):
        shards.get_batch(4, 8, torch.Generator().manual_seed(_))
except ShardError as err:
    print(err)
    sys.exit(3)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=False, timeout=120)
    assert run.returncode == 3, (run.returncode, run.stderr[-500:])  # was -7: SIGBUS
    assert "truncated to 2 bytes while in use" in run.stdout
    assert "train_000000.bin" in run.stdout


def test_a_full_disk_names_the_file_and_says_what_to_do(capsys, tmp_path, monkeypatch):
    import errno

    from conftest import run_cli as run

    import tinygpt.data

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tinygpt.data.os, "fsync", full)
    corpus = make_corpus(tmp_path / "in")
    code, _, err = run(capsys, "prepare", corpus, "--out", tmp_path / "out", "--tokenizer",
                       "char", "--workers", "1", "--quiet")
    assert code == 2 and err.count("\n") == 1, err
    assert "[Errno 28]" not in err  # was: tinygpt: error: [Errno 28] No space left on device
    assert "the disk is full while writing" in err and str(tmp_path / "out") in err
    assert "free some space" in err


def test_a_special_token_with_an_id_that_is_not_an_integer_says_so(tmp_path):
    import json

    from tinygpt.tokenizer import BPETokenizer

    tok = BPETokenizer.train("hello world " * 20, 300, special_tokens=["<|endoftext|>"])
    path = tmp_path / "tok.json"
    tok.save(path)
    model = json.loads(path.read_text())
    eot = model["special_tokens"]["<|endoftext|>"]
    for bad in (str(eot), float(eot)):
        model["special_tokens"]["<|endoftext|>"] = bad
        path.write_text(json.dumps(model))
        with pytest.raises(ValueError) as caught:
            BPETokenizer.load(path)
        message = str(caught.value)
        assert f"must have id {eot}, got {bad}" not in message  # was "id 266, got 266"
        assert f"has the id {bad!r}, a {type(bad).__name__}" in message, message


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_prepare_of_a_device_or_fifo_says_what_it_is_not_no_such_file(capsys, tmp_path, kind):
    import os

    from conftest import run_cli as run

    path = Path("/dev/zero")
    if kind == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
    code, _, err = run(capsys, "prepare", path, "--out", tmp_path / "out", "--quiet")
    assert code == 2 and err.count("\n") == 1, err
    assert "no such file" not in err  # was: "/dev/zero: no such file, no file in that folder..."
    assert ("a character device" if kind == "device" else "a FIFO") in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("betas", [[2, 0.9], "ab", [0.9], None])
def test_a_checkpoint_with_bad_betas_is_refused_in_one_line(capsys, trained, tmp_path, betas):
    import shutil

    from conftest import rewrite_manifest
    from conftest import run_cli as run

    out = tmp_path / "run"
    shutil.copytree(trained, out)
    rewrite_manifest(out, lambda m: m["optimizer"]["param_groups"][0].update(betas=betas))
    code, _, err = run(capsys, "train", "--data", trained.parent / "small.txt", "--out", out,
                       *TINY, "--resume", "--max-iters", "8")
    assert code == 2 and err.count("\n") == 1, err  # was: torch's kernel signatures, or rc 0
    assert "the optimizer's betas must be two numbers in [0, 1)" in err, err
    assert "checkpoint.json" in err


def test_bfloat16_autocast_with_qk_norm_gives_no_torch_warning():
    import warnings

    import torch

    from tinygpt.config import GPTConfig
    from tinygpt.model import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16,
                          qk_norm=True))
    idx = torch.randint(32, (2, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(idx, idx)
        loss.backward()
    assert not [str(w.message) for w in caught], [str(w.message) for w in caught]
    assert torch.isfinite(loss)


# --- the ladder's cache: entries that are FIFOs, folders or hostile NaN losses ------------------

def rung_loss_within(key: str, seconds: float = 60) -> float:
    """``ladder.rung_loss(key)``, failing (not hanging the suite) if it blocks."""
    import threading

    from tinygpt.book import ladder

    result: list = []
    thread = threading.Thread(target=lambda: result.append(ladder.rung_loss(key)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"rung_loss({key!r}) blocked"
    assert result, "rung_loss raised"
    return result[0]


def test_a_ladder_cache_entry_that_is_a_fifo_does_not_block(ladder_corpus):
    import math
    import os

    from tinygpt.book import ladder

    path = ladder._path("uniform")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    with pytest.warns(UserWarning, match="not a regular file"):
        loss = rung_loss_within("uniform")  # was: blocked for ever opening the FIFO
    assert loss == pytest.approx(math.log(ladder_corpus.tokenizer.vocab_size))


def test_a_ladder_cache_entry_that_is_a_folder_does_not_raise(ladder_corpus):
    import math

    from tinygpt.book import ladder

    path = ladder._path("uniform")
    path.mkdir(parents=True)
    with pytest.warns(UserWarning, match="cannot cache"):
        loss = ladder.rung_loss("uniform")  # was: IsADirectoryError
    assert loss == pytest.approx(math.log(ladder_corpus.tokenizer.vocab_size))
    assert path.is_dir()  # left alone


@pytest.mark.parametrize("hostile", [float("nan"), float("inf"), -1.0])
def test_a_ladder_cache_entry_with_a_hostile_loss_is_computed_again(ladder_corpus, hostile):
    import math

    from tinygpt.book import ladder, results_cache

    results_cache.write_json(ladder._path("uniform"), {"rung": "uniform", "loss": hostile})
    with pytest.warns(UserWarning, match="is not a loss"):
        loss = ladder.rung_loss("uniform")  # was: nan returned
    assert loss == pytest.approx(math.log(ladder_corpus.tokenizer.vocab_size))
