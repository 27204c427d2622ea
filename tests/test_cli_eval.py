"""``tinygpt eval``: a checkpoint's loss on a text in nats and bits, chapter 14's multiple-choice
test and compression baselines, as a table or JSON; bad input gets one line."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tinygpt.checkpoint import save_checkpoint
from tinygpt.cli import main
from tinygpt.cli.evaluate import compression_bits
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.tokenizer import BPETokenizer, CharTokenizer

PLAY = "".join(f"{who}:\nThe {i}th line that this speaker says here\nand then another line "
               f"goes on {i} times\n\n" for i, who in zip(range(60), ["KING", "QUEEN"] * 30))
PLAY = PLAY.replace("0", "o").replace("1", "l")  # digits vary the lines; any are fine


def saved(folder: Path, tokenizer, block_size: int = 32) -> Path:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=block_size, n_layer=1,
                          n_head=2, n_embd=16)).eval()
    save_checkpoint(folder, model, None, model.config, None, 5, tokenizer=tokenizer)
    return folder


@pytest.fixture(scope="module")
def text_and_ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    (folder / "play.txt").write_text(PLAY)
    return folder / "play.txt", saved(folder / "ckpt", CharTokenizer.from_text(PLAY), 192)


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["eval", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_loss_is_the_cross_entropy_of_every_prediction(tmp_path, capsys):
    text = "to be or not to be"  # one window: the loss is one cross-entropy
    tok = CharTokenizer.from_text(text)
    ckpt = saved(tmp_path / "c", tok, block_size=32)
    (tmp_path / "t.txt").write_text(text)
    code, out, err = run(capsys, ckpt, "--data", tmp_path / "t.txt", "--split", "all", "--json")
    assert code == 0, err
    result = json.loads(out)
    from tinygpt.checkpoint import load_checkpoint

    model = load_checkpoint(ckpt).model
    ids = torch.tensor(tok.encode(text))
    with torch.no_grad():
        logits = model(ids[None, :-1])
    nats = F.cross_entropy(logits[0], ids[1:]).item()
    assert result["loss_nats_per_token"] == pytest.approx(nats, rel=1e-5)
    assert result["bits_per_character"] == pytest.approx(nats / math.log(2), rel=1e-5)
    assert result["characters"] == len(text) and result["split"] == "all"


def test_the_table_the_choice_test_and_the_baselines(text_and_ckpt, capsys):
    text, ckpt = text_and_ckpt
    code, out, err = run(capsys, ckpt, "--data", text, "--multiple-choice", "--questions", "3",
                         "--compression")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("checkpoint") and "(step 5)" in lines[0]
    assert "validation split" in lines[1] and "nats per token" in lines[2]
    assert "bits per character" in lines[3]
    assert [line.split()[0:2] for line in lines[4:7]] == [["choice", "(word)"],
                                                          ["choice", "(space)"],
                                                          ["choice", "(line)"]]
    assert [line.split()[0] for line in lines[7:]] == ["gzip", "bzip2", "xz"]


def test_a_byte_level_tokenizer_is_scored_per_byte(tmp_path, capsys):
    text = "ça va, ça va bien " * 20
    ckpt = saved(tmp_path / "b", BPETokenizer.train(text, 260))
    (tmp_path / "t.txt").write_text(text)
    code, out, err = run(capsys, ckpt, "--data", tmp_path / "t.txt", "--json")
    assert code == 0, err
    assert math.isfinite(json.loads(out)["bits_per_byte"])


def test_compression_is_the_conditional_code_length():
    train, val = "to be or not to be " * 50, "to be or not to be"
    bits = compression_bits(train, val)
    direct = 8 * (len(gzip.compress((train + val).encode(), 9, mtime=0))
                  - len(gzip.compress(train.encode(), 9, mtime=0))) / len(val)
    assert bits["gzip"] == pytest.approx(direct)
    alone = compression_bits("", val)
    assert all(bits[k] < alone[k] for k in bits)  # the training text helps every compressor


def test_ppmd_is_pyppmds_conditional_code_length_order_8():
    """``--compression ppmd``: PPMd order 8 (variant H, 256 MiB) as chapter 14 measures it."""
    import pyppmd

    train, val = "to be or not to be, that is the question " * 30, "not to be, the answer"

    def size(text: str) -> int:
        return len(pyppmd.compress(text.encode(), max_order=8, mem_size=256 << 20,
                                   variant="H"))

    bits = compression_bits(train, val, ("gzip", "ppmd"))
    assert list(bits) == ["gzip", "ppmd"]
    assert bits["ppmd"] == 8 * (size(train + val) - size(train)) / len(val)
    alone = compression_bits("", val, ("ppmd",))["ppmd"]
    assert alone == 8 * size(val) / len(val)
    assert 0 < bits["ppmd"] < alone  # what it learned from the training text helps


def test_compression_names_its_kinds(text_and_ckpt, capsys):
    text, ckpt = text_and_ckpt
    for named, shown in [((), ["gzip", "bzip2", "xz"]), (("ppmd", "xz"), ["xz", "ppmd"]),
                         (("all",), ["gzip", "bzip2", "xz", "ppmd"])]:
        code, out, err = run(capsys, ckpt, "--data", text, "--json", "--compression", *named)
        assert code == 0, err
        assert list(json.loads(out)["compression_bits_per_character"]) == shown
    code, out, err = run(capsys, ckpt, "--data", text, "--compression", "ppmd")
    assert code == 0 and out.splitlines()[-1].startswith("PPMd order 8  "), out
    code, _, err = run(capsys, ckpt, "--data", text, "--compression", "zip")
    assert code == 2 and "invalid choice: 'zip'" in err and "ppmd" in err


@pytest.mark.parametrize(("args", "message"), [
    (("--data", "nowhere.txt"), "--data nowhere.txt: no such file"),
    (("--val-fraction", "1.5"), "--val-fraction 1.5: must be between 0 and 1"),
    (("--device", "tpu"), "--device tpu: not a device"),
])
def test_bad_options_are_one_line(text_and_ckpt, capsys, args, message):
    code, out, err = run(capsys, text_and_ckpt[1], *args)
    assert code == 2 and out == "" and message in err and len(err.splitlines()) == 1, err


def test_a_character_outside_the_vocabulary_is_refused_with_its_position(tmp_path, capsys,
                                                                        text_and_ckpt):
    (tmp_path / "t.txt").write_text("KING:\nThe line~\n")
    code, _, err = run(capsys, text_and_ckpt[1], "--data", tmp_path / "t.txt", "--split", "all")
    assert code == 2 and "'~' (character 15) is not in the checkpoint's vocabulary" in err, err


def test_the_choice_test_needs_speeches(tmp_path, capsys):
    text = "no speeches here at all, only words " * 30
    ckpt = saved(tmp_path / "c", CharTokenizer.from_text(text))
    (tmp_path / "t.txt").write_text(text)
    code, _, err = run(capsys, ckpt, "--data", tmp_path / "t.txt", "--multiple-choice")
    assert code == 2 and "has no speeches in the plays' format" in err, err
