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
from conftest import default_ctrl_c

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


@pytest.mark.parametrize("replier", [chat.DEFAULT_REPLIER, "FOOL"])
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
    assert all(r.startswith(f"{replier}:\n") for r in replies[0])


def test_the_session_refuses_bad_input():
    model = tiny_model(TOKENIZER.vocab_size)
    session = chat.ChatSession(model, TOKENIZER)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        session.reply("naïve")
    with pytest.raises(ValueError, match="special tokens"):
        session.reply(f"a{chat.END}")
    with pytest.raises(ValueError, match="no chat template"):
        chat.ChatSession(tiny_model(BASE.vocab_size), BASE)
    with pytest.raises(ValueError, match=r"replier 'ÉLODIE': 'É' .character 1. is not a char"):
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
    (0, "Hail \u25b6OPHELIA:\nhi", "holds '\u25b6' at character 6, one of the chat template"),
    (0, "\n\n  \u25a0", "holds '\u25a0' at character 5"),
    (0, "\u20ac\u20ac", "nothing is left of the speech"),
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
    default_ctrl_c()  # not ignored, as a background shell job would have it


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
        os.write(controller, b"/help\r")
        assert "/clear forgets the conversation" in read_until(controller, "ROMEO> ")
        os.write(controller, b"/clear\r")
        assert "(a new conversation)" in read_until(controller, "ROMEO> ")
        os.write(controller, b"half a line")
        time.sleep(0.3)
        os.write(controller, b"\x03")  # Ctrl-C drops the line
        assert "^C" in read_until(controller, "ROMEO> ")
        os.write(controller, "a~b \u25b7\r".encode())  # a special token: refused, loop goes on
        assert "holds '\u25b7' at character 5" in read_until(controller, "ROMEO> ")
        os.write(controller, b"a~b\r")  # an unknown character: dropped, said, and answered
        shown = read_until(controller, "ROMEO> ")
        assert "dropped 1 ('~' at 2)" in shown and "JULIET:" in shown
        os.write(controller, b"\x04")  # Ctrl-D ends
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)


# --- the template is the program's; the reader's text and the model's are kept in their place --

def biased(model: GPT, tokens: list[int], by: float = 60.0) -> GPT:
    """``model`` whose logits of ``tokens`` are raised by ``by``: a model that would write them."""
    forward = model.forward

    def raised(*args, **kwargs):
        out = forward(*args, **kwargs)
        logits = out[0] if isinstance(out, tuple) else out
        logits[..., tokens] += by
        return out

    model.forward = raised  # type: ignore[method-assign]
    return model


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_reply_never_opens_a_turn_nor_a_blank_line(use_cache):
    stoi = TOKENIZER.stoi
    model = biased(tiny_model(TOKENIZER.vocab_size, block_size=64),
                   [stoi[chat.SPEECH], stoi[chat.REPLY], stoi["\n"]])
    session = chat.ChatSession(model, TOKENIZER, max_chars=30, seed=1, use_cache=use_cache)
    for speech in ["To be", "Speak", "Go"]:
        reply = session.reply(speech).removeprefix(f"{chat.DEFAULT_REPLIER}:\n")
        assert chat.SPEECH not in reply and chat.REPLY not in reply and "\n\n" not in reply
        assert not reply.startswith("\n") and "\n" in reply  # the raised newline is written


def test_only_the_end_token_ends_a_reply():
    model = biased(tiny_model(TOKENIZER.vocab_size, block_size=64), [TOKENIZER.stoi[chat.END]])
    session = chat.ChatSession(model, TOKENIZER, seed=0)
    assert session.reply("Speak") == f"{chat.DEFAULT_REPLIER}:\n" and session.stop == "end"


def test_a_padded_vocabulary_is_taken_and_its_pad_never_sampled():
    model = biased(tiny_model(TOKENIZER.vocab_size + 6, block_size=64),
                   list(range(TOKENIZER.vocab_size, TOKENIZER.vocab_size + 6)))
    session = chat.ChatSession(model, TOKENIZER, max_chars=20, seed=0)
    reply = session.reply("To be")
    assert reply.startswith("HORATIO:\n") and all(i < TOKENIZER.vocab_size for i in session.ids)
    with pytest.raises(ValueError, match=r"the tokenizer has .* tokens but the model only"):
        chat.ChatSession(tiny_model(TOKENIZER.vocab_size - 1), TOKENIZER)


def test_the_reply_streams_piece_by_piece():
    session = chat.ChatSession(tiny_model(TOKENIZER.vocab_size), TOKENIZER, max_chars=15, seed=2)
    pieces: list[str] = []
    reply = session.reply("To be", on_text=pieces.append)
    assert "".join(pieces) == reply and pieces[0] == "HORATIO:\n" and len(pieces) >= 2


def test_a_long_speech_keeps_its_header_and_says_what_was_cut():
    session = chat.ChatSession(tiny_model(TOKENIZER.vocab_size, block_size=64), TOKENIZER,
                               max_chars=10, seed=0)
    speech = "word " * 300 + "the end"
    session.reply(speech)
    head = TOKENIZER.encode(f"{chat.SPEECH}HAMLET:\n")
    assert session.ids[:len(head)] == head  # the turn still opens with its speaker
    kept = TOKENIZER.decode(session.ids).split("\n")[1]
    assert kept.endswith("the end") and session.cut == len(speech) - len(kept) > 1000
    assert len(kept) <= session.room and session.fit(kept) == kept


def test_clear_forgets_the_conversation():
    session = chat.ChatSession(tiny_model(TOKENIZER.vocab_size), TOKENIZER, max_chars=5, seed=0)
    session.reply("To be")
    session.clear()
    assert session.ids == [] and session.fed == 0
    session.reply("Go")
    assert TOKENIZER.decode(session.ids).startswith(f"{chat.SPEECH}HAMLET:\nGo\n")


def test_the_names_of_a_fine_tuning_are_the_chats_defaults():
    talks = [chat.Conversation("ROMEO", "a", "JULIET", "b")] * 2 + [
        chat.Conversation("A", "a", "B", "b")]
    record = chat.names_record(talks, 7)
    assert chat.trained_names([{"step": 1, "loss": 2.0}, record]) == ("ROMEO", "JULIET")
    assert chat.trained_names([]) == (chat.DEFAULT_SPEAKER, chat.DEFAULT_REPLIER)
    assert chat.trained_names([{chat.NAMES_KEY: {"speaker": 3}}]) == ("HAMLET", "HORATIO")


def test_a_pipe_without_as_answers_as_a_trained_replier(checkpoints):
    out = run_chat(checkpoints[0], "--max-chars", "10", stdin="To be\n")
    assert out.returncode == 0 and out.stdout.startswith("HORATIO:\n"), out.stderr


def test_a_pipe_maps_and_drops_what_the_model_cannot_hold(checkpoints):
    out = run_chat(checkpoints[0], "--max-chars", "5",
                   stdin="\n\u201cÉlan\u201d in 1603 \u20ac\n")
    assert out.returncode == 0, out.stderr
    note = out.stderr.strip()
    assert len(note.splitlines()) == 1  # positions count the reader's first line break
    assert note == ("tinygpt: note: characters this model does not know: mapped 4 ('\u201c' at "
                    "2 -> \"'\", 'É' at 3 -> 'E', '\u201d' at 7 -> \"'\", '1603' at 12 -> 'one "
                    "six nought three'); dropped 1 ('\u20ac' at 17)")


def test_a_speech_longer_than_a_turn_is_cut_and_said(checkpoints):
    out = run_chat(checkpoints[0], "--max-chars", "5", stdin="to be or not " * 242 + "\n")
    assert out.returncode == 0, out.stderr
    assert ("the speech is 3,146 characters, more than the 60 a turn holds in this model's "
            "context of 128: only its last 59 are read") in out.stderr


def test_a_large_pipe_is_read_in_bounded_memory():
    from tinygpt.cli.chat import read_speech

    class Endless(io.StringIO):
        most = 0

        def read(self, n=-1):
            assert 0 < n <= 1 << 16  # never the whole input at once
            return super().read(n)

    stream = Endless("x" * 999_983 + "the end")
    tail, total = read_speech(stream, 100, chunk=4096)
    assert tail == ("x" * 999_983 + "the end")[-100:] and total == 999_990


def test_ten_megabytes_from_a_pipe_say_what_was_kept(checkpoints, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("To be or not to be. " * 500_000)  # 10 MB
    with big.open() as stdin:
        out = subprocess.run([sys.executable, "-m", "tinygpt", "chat", str(checkpoints[0]),
                              "--max-chars", "5"], stdin=stdin, capture_output=True, text=True,
                             env=child_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "the speech is 10,000,000 characters, more than the 60" in out.stderr


@pytest.mark.parametrize("closed", ["<&-", ">&-"])
def test_a_closed_stdin_or_stdout_is_one_line(checkpoints, closed):
    command = f'"{sys.executable}" -m tinygpt chat "{checkpoints[0]}" {closed}'
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=child_env(),
                         timeout=120, stdin=subprocess.DEVNULL if closed == ">&-" else None)
    what = "stdin" if closed == "<&-" else "stdout"
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(f"tinygpt: error: {what} is closed")
    assert len(out.stderr.splitlines()) == 1


@pytest.mark.parametrize(("args", "message"), [
    (("--as", "A:B"), "--as: replier must be a name on one line without ':'"),
    (("--speaker", "R~O"), "--speaker: speaker 'R~O': '~' (character 2) is not a character"),
    (("--as", "\u25b6X"), "--as: replier contains '\u25b6'"),
])
def test_a_bad_name_names_its_option(checkpoints, capsys, monkeypatch, args, message):
    code, _, err = chat_in_process(capsys, monkeypatch, checkpoints[0], *args)
    assert code == 2 and message in err and len(err.splitlines()) == 1, err


def test_the_memory_is_estimated_before_the_model_moves(checkpoints, capsys, monkeypatch):
    from tinygpt.cli import preflight

    monkeypatch.setattr(preflight, "available_memory", lambda device: 1000)
    code, _, err = chat_in_process(capsys, monkeypatch, checkpoints[0])
    assert code == 2 and "chatting needs about" in err and "has 1e+03 bytes available" in err, err


@pytest.mark.parametrize("free", [1, 2])
def test_chat_replies_on_the_cores_free_and_restores_the_thread_count(
        checkpoints, capsys, monkeypatch, free):
    from tinygpt import runtime

    seen = []
    real_reply = chat.ChatSession.reply

    def spy(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return real_reply(self, *args, **kwargs)

    monkeypatch.setattr(runtime, "threads_free", lambda window: free)
    monkeypatch.setattr(chat.ChatSession, "reply", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        code, out, err = chat_in_process(capsys, monkeypatch, checkpoints[0], "--max-chars", 8)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert code == 0 and out.strip(), err
    assert seen == [free] and after == 3
