"""``tinygpt train`` (``tinygpt.cli.train``): the ``--data`` it reads (a regular file, readable,
its line ends kept), a ``--val-fraction`` too small for the text, resuming on shards of another
tokenizer, and a diverged run that ends with the checkpoint it keeps. Each error is one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import (
    CLI_TINY,
    FOLDER_TEXT,
    FOLDER_TINY,
    assert_one_line_error,
    prepare_cli,
)
from conftest import run_cli as run

from tinygpt.checkpoint import load_checkpoint
from tinygpt.cli.train import read_data


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_resume_refuses_shards_of_another_tokenizer_of_the_same_type_and_size(capsys, tmp_path,
                                                                             kind):
    from tinygpt.shards import load_shards_tokenizer

    options = ["--tokenizer", kind] + (["--vocab-size", "300"] if kind == "bpe" else [])
    other = FOLDER_TEXT.replace("z", "#") if kind == "char" else FOLDER_TEXT.upper()
    prepare_cli(capsys, FOLDER_TEXT, tmp_path / "mine", *options)
    prepare_cli(capsys, other, tmp_path / "theirs", *options)
    mine = load_shards_tokenizer(tmp_path / "mine")
    theirs = load_shards_tokenizer(tmp_path / "theirs")
    assert (type(mine), mine.vocab_size) == (type(theirs), theirs.vocab_size)
    out = tmp_path / "run"
    assert run(capsys, "train", "--data", tmp_path / "mine", "--out", out, *FOLDER_TINY)[0] == 0
    code, _, err = run(capsys, "train", "--data", tmp_path / "theirs", "--out", out, *FOLDER_TINY,
                       "--resume", "--max-iters", "8")
    assert_one_line_error(code, err, "another of the same size", str(tmp_path / "theirs"))
    assert run(capsys, "train", "--data", tmp_path / "mine", "--out", out, *FOLDER_TINY,
               "--resume", "--max-iters", "8")[0] == 0


def test_a_tiny_val_fraction_is_not_printed_in_hundreds_of_digits(capsys, folder_data, tmp_path):
    code, _, err = run(capsys, "train", "--data", folder_data, "--out", tmp_path / "run",
                       *FOLDER_TINY, "--val-fraction", "1e-300")
    assert_one_line_error(code, err, "--val-fraction 1e-300", "about 1.7e+301 in all")
    assert len(err) < 400


@pytest.mark.parametrize("kind", ["/dev/null", "fifo", "folder"])
def test_data_that_is_not_a_regular_file_says_so(capsys, tmp_path, kind):
    path = {"/dev/null": Path("/dev/null"), "fifo": tmp_path / "fifo",
            "folder": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    code, _, err = run(capsys, "train", "--data", path, "--out", tmp_path / "o", *CLI_TINY)
    assert_one_line_error(code, err, str(path), "folder" if kind == "folder" else
                          "not a regular file")
    assert "no such file" not in err


def test_unreadable_data_file_says_permission_denied(capsys, cli_corpus, tmp_path, monkeypatch):
    def denied(self):  # chmod 000 does not stop root, who may run the tests
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "read_bytes", denied)
    code, _, err = run(capsys, "train", "--data", cli_corpus, "--out", tmp_path / "o", *CLI_TINY)
    assert_one_line_error(code, err, "permission denied", str(cli_corpus))
    assert "JSON" not in err


def test_crlf_and_cr_in_training_text_are_kept(tmp_path):
    path = tmp_path / "dos.txt"
    path.write_bytes(b"one\r\ntwo\rthree\n")
    text, _ = read_data(str(path))
    assert text.encode("utf-8") == path.read_bytes()


def test_a_diverged_run_keeps_its_last_good_checkpoint(capsys, cli_corpus, tmp_path):
    out = tmp_path / "run"
    code, _, err = run(capsys, "train", "--data", cli_corpus, "--out", out, *CLI_TINY,
                       "--max-iters", 50, "--lr", "1e3", "--warmup-iters", "0", "--save-every", "1")
    assert code == 1 and "diverged" in err and "Traceback" not in err
    if (out / "checkpoint.json").exists():  # whatever was kept is finite and samples cleanly
        kept = load_checkpoint(out)
        assert f"checkpoint of step {kept.step} in {out} is kept" in err
        assert all(torch.isfinite(p).all() for p in kept.model.parameters())
        code, text, err = run(capsys, "sample", "--out", out, "--max-new-tokens", 20)
        assert code == 0 and len(text) > 1
        diverged = max(r.get("loss", 0) for r in kept.history) > 10  # ln 32 = 3.5 at the start
        assert diverged or err == ""  # a diverged one: one warning
        assert not diverged or (err.startswith("tinygpt: warning:") and "diverged" in err
                                and err.count("\n") == 1), err
    else:
        assert "no checkpoint was saved" in err
