"""Hostile or stray inputs (issue 35): links, devices and FIFOs where tinygpt expects its own
files, edited manifests, another tokenizer's shards, deeply nested JSON. Each is refused with one
clear line naming the file or option, and nothing that tinygpt did not write is changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_cli as run

TEXT = "".join(f"{w} the {v} was {n} and more zebra.\n" for w, v, n in zip(
    ["first", "second", "third", "fourth", "fifth", "sixth"] * 5,
    ["cat", "dog", "fox", "owl", "ant", "bee"] * 5, range(30)))
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "2", "--max-iters", "5", "--eval-interval", "5", "--eval-iters", "1",
        "--quiet"]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "small.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def assert_refused(code: int, err: str, *words: str) -> None:
    assert code == 2 and err.startswith("tinygpt: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


# --- item 1: the lock file ----------------------------------------------------------------------

@pytest.mark.parametrize("resume", [False, True])
@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(capsys, data, tmp_path,
                                                                   resume, kind):
    out = tmp_path / "run"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    if resume:
        assert run(capsys, "train", "--data", data, "--out", out, *TINY)[0] == 0
        (out / ".tinygpt.lock").unlink()
    else:
        out.mkdir()
    if kind == "symlink":
        (out / ".tinygpt.lock").symlink_to("../victim.txt")
    else:
        os.link(victim, out / ".tinygpt.lock")
    extra = ["--resume", "--max-iters", "8"] if resume else []
    code, _, err = run(capsys, "train", "--data", data, "--out", out, *TINY, *extra)
    assert_refused(code, err, ".tinygpt.lock", "link")
    assert victim.read_text() == "precious\n"


def test_a_lock_file_that_is_a_fifo_is_refused(capsys, data, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / ".tinygpt.lock")
    code, _, err = run(capsys, "train", "--data", data, "--out", out, *TINY)
    assert_refused(code, err, ".tinygpt.lock", "not a regular file")
