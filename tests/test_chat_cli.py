"""``tinygpt chat`` and the session behind it (``tinygpt.chat.ChatSession``).

The session's key/value cache across turns gives the replies of recomputing the whole context
for every token, through turns that overflow the context. The command, as a real process: from
a pipe it prints one reply; at a terminal (a pseudo-terminal, ``os.openpty``) it answers a line,
survives Ctrl-C and ends on Ctrl-D; a checkpoint without a chat template, an empty pipe and an
unknown character get clear errors. The special tokens survive a checkpoint's save and load.
"""

from __future__ import annotations

import fcntl
import io
import os
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import torch

from tinygpt import chat
from tinygpt.checkpoint import load_checkpoint, save_checkpoint
from tinygpt.config import GPTConfig
from tinygpt.model import GPT
from tinygpt.tokenizer import CharTokenizer

BASE = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.!?':\n")
TOKENIZER = chat.chat_tokenizer(BASE)


def tiny_model(vocab_size: int, block_size: int = 48) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=2, n_head=2,
                         n_embd=16)).eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    """A chat checkpoint and a plain one (no template), of untrained tiny models."""
    folder = tmp_path_factory.mktemp("chat")
    with_template, plain = folder / "chat model", folder / "plain"
    for path, tok in ((with_template, TOKENIZER), (plain, BASE)):
        model = tiny_model(tok.vocab_size, block_size=128)
        save_checkpoint(path, model, None, model.config, None, 0, tokenizer=tok)
    return with_template, plain


def child_env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def test_the_special_tokens_survive_a_checkpoint(checkpoints):
    loaded = load_checkpoint(checkpoints[0]).tokenizer
    assert isinstance(loaded, CharTokenizer) and loaded.chars == TOKENIZER.chars
    assert chat.has_chat_template(loaded)
    assert not chat.has_chat_template(load_checkpoint(checkpoints[1]).tokenizer)


@pytest.mark.parametrize("replier", [None, "FOOL"])
def test_the_cache_across_turns_gives_the_replies_of_recomputing(replier):
    model = tiny_model(TOKENIZER.vocab_size)  # a context of 48: turns overflow it
    sessions = [chat.ChatSession(model, TOKENIZER, replier=replier, max_chars=30, seed=3,
                                 use_cache=cache, reserve=20) for cache in (True, False)]
    speeches = ["To be, or not to be", "Speak!", "Nay, my lord, I will not.", "Go"]
    replies = [[s.reply(speech) for speech in speeches] for s in sessions]
    assert replies[0] == replies[1]
    assert all(len(r) >= 1 for r in replies[0])
    cached = sessions[0]
    assert len(cached.ids) <= 48 and cached.fed <= len(cached.ids)
    if replier is not None:
        assert all(r.startswith("FOOL:\n") for r in replies[0])


def test_the_session_refuses_bad_input():
    model = tiny_model(TOKENIZER.vocab_size)
    session = chat.ChatSession(model, TOKENIZER)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        session.reply("naïve")
    with pytest.raises(ValueError, match="special tokens"):
        session.reply(f"a{chat.END}")
    with pytest.raises(ValueError, match="no chat template"):
        chat.ChatSession(tiny_model(BASE.vocab_size), BASE)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        chat.ChatSession(model, TOKENIZER, replier="ÉLODIE")
    with pytest.raises(ValueError):
        chat.ChatSession(model, TOKENIZER, temperature=-1.0)


def run_chat(*args: object, stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tinygpt", "chat", *map(str, args)],
                          input=stdin, capture_output=True, text=True, env=child_env(),
                          timeout=120)


def test_a_pipe_gets_one_reply(checkpoints):
    out = run_chat(checkpoints[0], "--as", "OPHELIA", "--max-chars", "20",
                   stdin="To be, or not to be\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OPHELIA:\n") and out.stderr == ""
    assert len(out.stdout) <= len("OPHELIA:\n") + 20 + 1
    again = run_chat(checkpoints[0], "--as", "OPHELIA", "--max-chars", "20",
                     stdin="To be, or not to be\n")
    assert again.stdout == out.stdout  # seeded


@pytest.mark.parametrize(("checkpoint", "stdin", "message"), [
    (1, "Hello", "has no chat template: its tokenizer lacks the special tokens"),
    (0, "\n", "the input is empty"),
    (0, "Élan", "is not in the vocabulary"),
])
def test_the_command_reports_bad_input(checkpoints, checkpoint, stdin, message):
    out = run_chat(checkpoints[checkpoint], stdin=stdin)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, \
        out.stderr


def chat_in_process(capsys, monkeypatch, *args: object, stdin: str = "To be\n"):
    """``tinygpt chat`` run by ``tinygpt.cli.main`` in this process: (code, stdout, stderr)."""
    from tinygpt.cli import main

    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))  # not a terminal: one reply
    code = main(["chat", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(("args", "message"), [
    (("--device", "cuda:7"), "--device cuda:7: was asked for, but this machine has"),
    (("--device", "tpu"), "--device tpu: not a device tinygpt runs on"),
    (("--seed", str(2**63)), "--seed 9223372036854775808: a seed must be an integer from 0"),
    (("--top-k", "0"), "(option --top-k)"),
    (("--top-p", "1.5"), "(option --top-p)"),
    (("--temperature", "-1"), "(option --temperature)"),
    (("--max-chars", "0"), "(option --max-chars)"),
])
def test_a_bad_sampling_option_or_device_is_refused_naming_it(checkpoints, capsys, monkeypatch,
                                                               args, message):
    code, out, err = chat_in_process(capsys, monkeypatch, checkpoints[0], *args)
    assert code == 2 and out == "" and message in err and "Traceback" not in err, err
    assert err.startswith("tinygpt: error: ") and len(err.splitlines()) == 1


def test_device_cpu_gives_the_reply_of_the_default(checkpoints, capsys, monkeypatch):
    replies = [chat_in_process(capsys, monkeypatch, checkpoints[0], "--max-chars", 12, *device)
               for device in ((), ("--device", "cpu"))]
    assert replies[0] == replies[1] and replies[0][0] == 0 and replies[0][1].strip()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_session_runs_on_the_models_device():
    model = tiny_model(TOKENIZER.vocab_size, block_size=64)
    on_cpu = chat.ChatSession(model, TOKENIZER, replier="OPHELIA", temperature=0, max_chars=20)
    on_cuda = chat.ChatSession(tiny_model(TOKENIZER.vocab_size, block_size=64).to("cuda"),
                               TOKENIZER, replier="OPHELIA", temperature=0, max_chars=20)
    assert on_cuda.device.type == "cuda" and on_cuda.generator.device.type == "cuda"
    assert on_cuda.reply("To be") == on_cpu.reply("To be")  # greedy: the same reply


def read_until(fd: int, wanted: str, timeout: float = 60) -> str:
    """What the terminal shows until ``wanted`` appears (or the timeout)."""
    seen, deadline = "", time.monotonic() + timeout
    while wanted not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 4096).decode("utf-8", errors="replace")
            except OSError:  # the child closed the terminal
                break
    return seen


def controlling_terminal() -> None:
    """In the child, in its new session: make its stdin, the pseudo-terminal, the session's
    controlling terminal, so that Ctrl-C typed on it sends SIGINT as a real terminal does."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_the_interactive_loop_at_a_terminal(checkpoints):
    controller, terminal = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "tinygpt", "chat", str(checkpoints[0]),
                             "--speaker", "ROMEO", "--as", "JULIET", "--max-chars", "10"],
                            stdin=terminal, stdout=terminal, stderr=terminal, env=child_env(),
                            start_new_session=True, preexec_fn=controlling_terminal)
    os.close(terminal)
    try:
        assert "ROMEO> " in read_until(controller, "ROMEO> ")
        os.write(controller, b"But soft\r")
        shown = read_until(controller, "ROMEO> ")
        assert "JULIET:" in shown and shown.rstrip().endswith("ROMEO>")
        os.write(controller, b"half a line")
        time.sleep(0.3)
        os.write(controller, b"\x03")  # Ctrl-C drops the line
        assert "^C" in read_until(controller, "ROMEO> ")
        os.write(controller, b"a~b\r")  # an unknown character: said, and the loop goes on
        assert "not in the vocabulary" in read_until(controller, "ROMEO> ")
        os.write(controller, b"\x04")  # Ctrl-D ends
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)
