"""``tinygpt finetune``: SFT from a conversations file (or the plays), with LoRA or fully, and
preference tuning with ``--dpo``; the output folder is as safe as ``tinygpt train``'s."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tinygpt import chat
from tinygpt.checkpoint import load_checkpoint, save_checkpoint
from tinygpt.cli import main
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.tokenizer import BPETokenizer, CharTokenizer

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n\nJULIET:\nAy me!\n"
TALKS = [{"turns": [{"speaker": "ROMEO", "text": "But soft, what light?"},
                    {"speaker": "JULIET", "text": "Ay me!"},
                    {"speaker": "ROMEO", "text": "She speaks."}]},
         {"turns": [{"speaker": "ROMEO", "text": "Good morrow."},
                    {"speaker": "JULIET", "text": "Good morrow, love."}]}]
PAIRS = [{"speaker": "ROMEO", "speech": "Good morrow.", "replier": "JULIET",
          "chosen": "Good morrow, my love.", "rejected": "No."}]


def base(folder: Path, tokenizer=None) -> Path:
    tokenizer = tokenizer or CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=1, n_head=2,
                          n_embd=16))
    save_checkpoint(folder, model, None, model.config, None, 10, tokenizer=tokenizer)
    return folder


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def finetune(capsys, *args) -> tuple[int, str, str]:
    code = main(["finetune", *map(str, args), "--quiet"])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("ft")
    code = main(["finetune", str(base(folder / "base")), "--data",
                 str(jsonl(folder / "talks.jsonl", TALKS)), "--out", str(folder / "chat"),
                 "--max-iters", "4", "--batch-size", "2", "--quiet"])
    assert code == 0
    return folder / "base", folder / "chat"


def test_sft_widens_the_model_and_records_the_names_chat_uses(tuned, capsys, monkeypatch):
    import io
    import sys

    ckpt = load_checkpoint(tuned[1])
    assert chat.has_chat_template(ckpt.tokenizer)
    assert ckpt.model_config.vocab_size == load_checkpoint(tuned[0]).model_config.vocab_size + 3
    assert chat.trained_names(ckpt.history) == ("ROMEO", "JULIET")
    assert [r["step"] for r in ckpt.history if "loss" in r] == [0, 1, 2, 3]
    monkeypatch.setattr(sys, "stdin", io.StringIO("Good morrow\n"))
    assert main(["chat", str(tuned[1]), "--max-chars", "5"]) == 0
    assert capsys.readouterr().out.startswith("JULIET:\n")


def test_lora_trains_a_change_merged_into_plain_weights(tuned, tmp_path, capsys):
    code, out, err = finetune(capsys, tuned[0], "--data", tuned[1].parent / "talks.jsonl",
                              "--out", tmp_path / "lora", "--max-iters", "3",
                              "--batch-size", "2", "--lora-rank", "2")
    assert code == 0, err
    assert "fine-tuned 3 steps on 3 conversations" in out
    full = load_checkpoint(tuned[0]).model.state_dict()
    lora = load_checkpoint(tmp_path / "lora").model.state_dict()
    assert set(lora) == set(full)  # no LoRA tensors saved: plain weights
    changed = [k for k in full if "c_attn" in k and "weight" in k
               and not torch.equal(full[k], lora[k])]
    assert changed  # the change was merged into the attention's weights


def test_dpo_starts_at_log_two_and_keeps_the_names(tuned, tmp_path, capsys):
    code, _, err = finetune(capsys, tuned[1], "--dpo", jsonl(tmp_path / "p.jsonl", PAIRS),
                              "--out", tmp_path / "dpo", "--max-iters", "2",
                              "--batch-size", "1")
    assert code == 0, err
    history = load_checkpoint(tmp_path / "dpo").history
    assert history[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert chat.trained_names(history) == ("ROMEO", "JULIET")


@pytest.mark.parametrize(("rows", "message"), [
    (["not json"], "line 1: not JSON"),
    ([{"turns": [{"speaker": "A", "text": "x"}]}], "line 1: \"turns\" must be a list of at"),
    ([{"turns": [{"speaker": "A:B", "text": "x"}, {"speaker": "C", "text": "y"}]}],
     "line 1, turn 1: speaker must be a name on one line without ':'"),
])
def test_a_bad_conversation_file_names_its_line(tuned, tmp_path, capsys, rows, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    code, _, err = finetune(capsys, tuned[0], "--data", path, "--out", tmp_path / "o")
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_the_output_folder_is_never_a_users_nor_overwritten(tuned, tmp_path, capsys):
    talks = tuned[1].parent / "talks.jsonl"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    code, _, err = finetune(capsys, tuned[0], "--data", talks, "--out", tmp_path / "mine")
    assert code == 2 and "is not empty (notes.txt)" in err
    code, _, err = finetune(capsys, tuned[0], "--data", talks, "--out", tuned[1])
    assert code == 2 and "holds a checkpoint already" in err and "--overwrite" in err
    code, _, err = finetune(capsys, tuned[0], "--data", talks, "--out", tuned[0],
                            "--overwrite")
    assert code == 2 and "is the checkpoint fine-tuned" in err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_what_cannot_be_fine_tuned_is_refused(tuned, tmp_path, capsys):
    talks = tuned[1].parent / "talks.jsonl"
    code, _, err = finetune(capsys, tuned[0], "--out", tmp_path / "o")
    assert code == 2 and "give --data CONVERSATIONS" in err
    code, _, err = finetune(capsys, tuned[0], "--dpo", talks, "--out", tmp_path / "o")
    assert code == 2 and "has no chat template: fine-tune it with --data first" in err
    bpe = base(tmp_path / "bpe", BPETokenizer.train(TEXT * 3, 258))
    code, _, err = finetune(capsys, bpe, "--data", talks, "--out", tmp_path / "o")
    assert code == 2 and "takes a character-level checkpoint" in err
