"""``tinygpt finetune``: SFT from a conversations file (or the plays), with LoRA or fully, and
preference tuning with ``--dpo``; the output folder is as safe as ``tinygpt train``'s."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import lock_held_elsewhere

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


# --- exact resume ---------------------------------------------------------------------------------

def dropout_base(folder: Path) -> Path:
    """A base whose dropout draws from torch's RNG: a resume must restore it to be exact."""
    tokenizer = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=1, n_head=2,
                          n_embd=16, dropout=0.1))
    save_checkpoint(folder, model, None, model.config, None, 10, tokenizer=tokenizer)
    return folder


def interrupt_at(monkeypatch, module, name: str, call: int) -> None:
    """Make ``module.name`` raise KeyboardInterrupt (a Ctrl-C) at its ``call``-th call."""
    real, calls = getattr(module, name), []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, dying)


@pytest.mark.parametrize("mode", ["sft", "lora", "dpo"])
def test_an_interrupted_finetune_resumes_to_the_weights_of_an_uninterrupted_one(
        tuned, tmp_path, capsys, monkeypatch, mode):
    from tinygpt import dpo

    if mode == "dpo":
        pairs = [{**PAIRS[0], "chosen": f"Good morrow, my love{'!' * i}"} for i in range(4)]
        start, data = tuned[1], ["--dpo", jsonl(tmp_path / "p.jsonl", pairs)]  # batches differ
    else:
        start, data = dropout_base(tmp_path / "base"), ["--data", tuned[1].parent / "talks.jsonl"]
    options = [*data, "--max-iters", "7", "--batch-size", "2", "--save-every", "2",
               *(["--lora-rank", "2"] if mode == "lora" else [])]
    code, _, err = finetune(capsys, start, *options, "--out", tmp_path / "straight")
    assert code == 0, err
    with monkeypatch.context() as patch:  # Ctrl-C in step 5 (0-based): steps 0..4 done, 4 saved
        interrupt_at(patch, dpo if mode == "dpo" else chat,
                     "dpo_loss" if mode == "dpo" else "reply_loss", 6)
        code, _, err = finetune(capsys, start, *options, "--out", tmp_path / "cut")
    assert code == 130 and "the checkpoint of step 4" in err and "--resume" in err, err
    assert load_checkpoint(tmp_path / "cut").step == 4
    torch.manual_seed(999)  # another state of the global RNG, as in a new process
    code, out, err = finetune(capsys, start, *options, "--out", tmp_path / "cut", "--resume")
    assert code == 0 and "fine-tuned 3 steps (from step 4)" in out, err
    a, b = load_checkpoint(tmp_path / "straight"), load_checkpoint(tmp_path / "cut")
    assert a.step == b.step == 7 and b.optimizer_state is None  # a finished run: no state
    for (name, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values(),
                            strict=True):
        assert torch.equal(p, q), name
    assert [r.get("loss") for r in a.history] == [r.get("loss") for r in b.history]
    assert chat.trained_names(a.history) == chat.trained_names(b.history) == ("ROMEO", "JULIET")
    assert not torch.equal(a.model.state_dict()["transformer.h.0.attn.c_attn.weight"],
                           load_checkpoint(start).model.state_dict()[
                               "transformer.h.0.attn.c_attn.weight"])  # it did train


def test_the_uninterrupted_run_is_chat_fine_tunes_and_train_dpos(tuned, tmp_path, capsys):
    """The command's own steps are those of ``chat.fine_tune`` and ``dpo.train_dpo``."""
    from tinygpt import dpo
    from tinygpt.cli.finetune import fitted, read_conversations, read_pairs
    from tinygpt.config import TrainConfig

    talks = tuned[1].parent / "talks.jsonl"
    code, _, err = finetune(capsys, tuned[0], "--data", talks, "--out", tmp_path / "sft",
                            "--max-iters", "5", "--batch-size", "2")
    assert code == 0, err
    start = load_checkpoint(tuned[0])
    model = chat.add_tokens(start.model, len(chat.SPECIAL_TOKENS))
    tokenizer = chat.chat_tokenizer(start.tokenizer)
    examples, _ = fitted(read_conversations(str(talks)), set(start.tokenizer.chars), 64)
    config = TrainConfig(batch_size=2, max_iters=5, learning_rate=1e-3, min_lr=1e-4,
                         warmup_iters=1, weight_decay=0.0, seed=0)
    torch.manual_seed(0)
    chat.fine_tune(model, tokenizer, examples, config)
    for name, p in load_checkpoint(tmp_path / "sft").model.state_dict().items():
        assert torch.equal(p, model.state_dict()[name]), name

    pairs = jsonl(tmp_path / "p.jsonl", [{"speaker": "ROMEO", "speech": "But soft!",  # known
                                          "replier": "JULIET", "chosen": "Ay me!",  # characters:
                                          "rejected": "what light"}] * 2)  # nothing folded
    code, _, err = finetune(capsys, tuned[1], "--dpo", pairs, "--out", tmp_path / "dpo",
                            "--max-iters", "3", "--batch-size", "1")
    assert code == 0, err
    policy = load_checkpoint(tuned[1]).model
    config = TrainConfig(batch_size=1, max_iters=3, learning_rate=1e-4, min_lr=1e-5,
                         warmup_iters=1, weight_decay=0.0, seed=0)
    dpo.train_dpo(policy, load_checkpoint(tuned[1]).tokenizer, read_pairs(str(pairs)), config,
                  0.1)
    for name, p in load_checkpoint(tmp_path / "dpo").model.state_dict().items():
        assert torch.equal(p, policy.state_dict()[name]), name


def test_a_resume_of_another_run_is_refused_naming_what_differs(tuned, tmp_path, capsys,
                                                                 monkeypatch):
    talks = tuned[1].parent / "talks.jsonl"
    options = ["--data", talks, "--out", tmp_path / "cut", "--max-iters", "6", "--batch-size",
               "2", "--save-every", "2"]
    with monkeypatch.context() as patch:
        interrupt_at(patch, chat, "reply_loss", 4)
        assert finetune(capsys, tuned[0], *options)[0] == 130
    manifest = (tmp_path / "cut" / "checkpoint.json").read_bytes()
    other = jsonl(tmp_path / "other.jsonl", TALKS[:1])
    for args, message in [
            ((tuned[0], *options, "--max-iters", "9"), "--max-iters 9 differs from the "
             "interrupted run"),
            ((tuned[0], *options, "--lora-rank", "2"), "--lora-rank 2 differs"),
            ((tuned[0], *options, "--seed", "3"), "--seed 3 differs"),
            ((tuned[0], *options, "--data", other), f"{other} holds other examples"),
            ((dropout_base(tmp_path / "b2"), *options), "is not the checkpoint the interrupted"),
            ((tuned[0], *options, "--overwrite"), "give one of them"),
            ((tuned[0], *options[:2], "--out", tuned[1]), "holds a finished fine-tuning"),
            ((tuned[1], *options[:2], "--out", tuned[0]), "of no tinygpt finetune run")]:
        code, _, err = finetune(capsys, *args, "--resume")
        assert code == 2 and message in err and len(err.splitlines()) == 1, (args, err)
    code, _, err = finetune(capsys, tuned[0], *options)  # without --resume: not replaced
    assert code == 2 and "or --resume to continue" in err
    assert (tmp_path / "cut" / "checkpoint.json").read_bytes() == manifest


def test_a_second_finetune_into_a_folder_in_use_is_refused(tuned, tmp_path, capsys):
    out = tmp_path / "busy"
    with lock_held_elsewhere(out):
        code, _, err = finetune(capsys, tuned[0], "--data", tuned[1].parent / "talks.jsonl",
                                "--out", out, "--max-iters", "2")
        assert code == 2 and "in use by another tinygpt process" in err, err
        assert sorted(p.name for p in out.iterdir()) == [".tinygpt.lock"]


def test_the_plays_by_name_fine_tune_a_tiny_model_end_to_end(tmp_path, capsys, monkeypatch):
    """``--data plays``: the book's training conversations (``book.chat_model.conversations``),
    fitted to a tiny model's characters and context, tuned, and the result answers from a pipe
    as the replier it was tuned to."""
    import io
    import sys

    from tinygpt.book.chat_model import conversations

    plays = conversations()[0]
    code, out, err = finetune(capsys, base(tmp_path / "base"), "--data", "plays", "--out",
                              tmp_path / "chat", "--max-iters", "2", "--batch-size", "4")
    assert code == 0, err
    assert "characters the model does not know were mapped or dropped" in err  # TEXT's only
    tuned = int(out.split(" on ")[1].split(" conversations")[0].replace(",", ""))
    assert 0 < tuned <= len(plays)  # the pairs that fit a 64-character context
    ckpt = load_checkpoint(tmp_path / "chat")
    assert [r["step"] for r in ckpt.history if "loss" in r] == [0, 1]
    speaker, replier = chat.trained_names(ckpt.history)
    # the names of a pair of the plays, in the characters the model knows (TEXT's capitals only)
    assert (speaker.upper(), replier.upper()) in {(c.speaker, c.replier) for c in plays}
    monkeypatch.setattr(sys, "stdin", io.StringIO("But soft\n"))
    assert main(["chat", str(tmp_path / "chat"), "--max-chars", "5"]) == 0
    assert capsys.readouterr().out.startswith(f"{replier}:\n")
