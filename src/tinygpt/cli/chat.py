"""``tinygpt chat CHECKPOINT``: talk with a model fine-tuned to the chat template
(``tinygpt.chat``).

At a terminal it is a loop: a line typed (with readline's line editing and history, where
Python has readline) is a speech; the model's reply is printed as it is sampled; Ctrl-C drops
the line being typed or stops the reply being written, Ctrl-D (or ``/quit``) ends, ``/clear``
forgets the conversation, ``/help`` lists the commands. Reading from a pipe, the input is one
speech and one reply is printed; at most what one turn can hold is kept in memory (the end of
the input), and a cut is said.

The replier's name is written by the program, never sampled (the model never learned to write
it): ``--as``, else the replier the checkpoint was fine-tuned to answer as most often
(``tinygpt.chat.trained_names``), else ``tinygpt.chat.DEFAULT_REPLIER``. The reader's text is
checked before it reaches the template: a special token of the template is refused (it would
forge a turn), a character the model does not know is mapped to its nearest known one or dropped
(``tinygpt.cli.fold``), and a speech longer than a turn holds is cut to its end; each is said in one
line on stderr, with positions counted in the reader's own text. The memory the session needs is
estimated before the model is moved to ``--device``. The sampling options are those of
``tinygpt sample`` (``tinygpt.cli.sampling_options``); on the CPU it samples, as ``sample`` does,
on as many torch threads as cores are free when the session opens (``runtime.free_threads``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import IO, Any

from tinygpt.cli import preflight, sampling_options

DESCRIPTION = """\
Talk with a model fine-tuned to the chat template of tinygpt.chat (tinygpt finetune makes one;
so does the book's chapter 15). At a terminal, type a speech and press Enter; the reply is
printed as it is written. Ctrl-C drops the line (or stops a reply), Ctrl-D or /quit ends,
/clear starts a new conversation, /help lists these. From a pipe, the input is one speech and
one reply is printed. The replier's name is written by the program, never by the model."""

# ChatSession's parameters and their options, to name the option in an error about one
OPTION_NAMES = {**sampling_options.OPTION_NAMES, "max_chars": "--max-chars"}
NAME_OPTIONS = {"speaker": "--speaker", "replier": "--as"}

HELP = ("commands: /clear forgets the conversation, /help shows this, /quit (or Ctrl-D) ends; "
        "Ctrl-C drops the line being typed or stops a reply")

EPILOG = """\
examples:
  tinygpt chat out/chat
  tinygpt chat out/chat --as OPHELIA --temperature 0.6
  echo "To be, or not to be" | tinygpt chat out/chat
"""


def add_chat(commands: Any, add_option: Any) -> None:
    """Add the ``chat`` command to the ``tinygpt`` parser's ``commands``."""
    parser = commands.add_parser("chat", help="talk with a chat model (a checkpoint)",
                                 description=DESCRIPTION, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="the checkpoint folder of a model fine-tuned to chat")
    add_option(parser, "--as", "the speaker who replies (its name is written for the model)",
               shown="the replier the checkpoint was fine-tuned on most, else HORATIO",
               dest="replier", metavar="SPEAKER")
    add_option(parser, "--speaker", "your name in the conversation",
               shown="the speaker the checkpoint was fine-tuned on most, else HAMLET",
               metavar="NAME")
    add_option(parser, "--max-chars", "the longest reply, in characters", type=int, default=200,
               metavar="INT")
    sampling_options.add_sampling_options(parser, add_option, seed=0)
    parser.set_defaults(run=run_chat)


def note(text: str) -> None:
    """One line on stderr: what was done to the reader's text."""
    print(f"tinygpt: note: {text}", file=sys.stderr, flush=True)


def open_session(args: argparse.Namespace) -> Any:
    """The ``ChatSession`` of the checkpoint and options in ``args``; a clear error for a
    checkpoint without a chat template, for a name the model cannot take (naming ``--as`` or
    ``--speaker``) and for a session that would not fit in the device's memory."""
    from tinygpt.chat import SPECIAL_TOKENS, ChatSession, has_chat_template, trained_names
    from tinygpt.checkpoint import load_checkpoint
    from tinygpt.runtime import resolve_device

    sampling_options.check_sampling_options(args)  # seed and device, before the checkpoint is read
    ckpt = load_checkpoint(args.checkpoint)
    if not has_chat_template(ckpt.tokenizer):
        raise ValueError(f"the checkpoint in {args.checkpoint} has no chat template: its "
                         f"tokenizer lacks the special tokens {' '.join(SPECIAL_TOKENS)}, so it "
                         "is a language model not fine-tuned to chat; use `tinygpt sample` with "
                         "it, or fine-tune it first (tinygpt finetune)")
    speaker, replier = trained_names(ckpt.history)
    names: dict[str, str] = {"speaker": args.speaker or speaker,
                             "replier": args.replier or replier}
    device = resolve_device(args.device)
    need = preflight.sample_memory(ckpt.model_config, 1, ckpt.model_config.block_size, 0)
    preflight.check_memory(need, device.type if device.type == "cpu" else str(device),
                           "chatting", "use a smaller model or another --device")
    model = sampling_options.model_on_device(ckpt.model, device, args.device)
    try:
        return ChatSession(model, ckpt.tokenizer, speaker=names["speaker"],
                           replier=names["replier"], temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, max_chars=args.max_chars,
                           seed=args.seed, use_cache=not args.no_cache)
    except ValueError as err:  # a name: say which option gave it
        what = next((w for w in NAME_OPTIONS if str(err).startswith(w)), None)
        if what is None:
            raise
        given = getattr(args, what)
        source = NAME_OPTIONS[what] if given else (
            f"the default {NAME_OPTIONS[what][2:]} (give {NAME_OPTIONS[what]})")
        raise ValueError(f"{source}: {err}") from None


def read_speech(stream: IO[str], limit: int, chunk: int = 1 << 16) -> tuple[str, int]:
    """The last ``limit`` characters of ``stream`` (read to its end, ``chunk`` characters at a
    time, never holding more than ``limit + chunk``) and the number of characters read."""
    tail, total = "", 0
    while True:
        piece = stream.read(chunk)
        if not piece:
            return tail, total
        total += len(piece)
        tail = (tail + piece)[-limit:]


def prepare(session: Any, text: str, first: int = 1, unread: int = 0) -> str:
    """The reader's ``text`` made ready for ``session``: a special token of the template
    refused, unknown characters folded and the speech cut to what a turn holds, each said in
    a note. Positions count from ``first`` (the character of the reader's text that
    ``text[0]`` is); ``unread``: the characters before ``text`` that were not kept (the end of
    a long input is all that is read)."""
    from tinygpt.chat import SPECIAL_TOKENS
    from tinygpt.cli import fold

    forged = next((i for i, c in enumerate(text) if c in SPECIAL_TOKENS), None)
    if forged is not None:
        raise ValueError(f"the speech holds {text[forged]!r} at character {forged + first}, one "
                         f"of the chat template's special tokens {' '.join(SPECIAL_TOKENS)}: only "
                         "the program writes them (they open and end turns); remove it")
    folded = fold.fold(text, session.tokenizer.stoi.keys() - set(SPECIAL_TOKENS))
    said = fold.describe(folded, first)
    if said:
        note(f"characters this model does not know: {said}")
    speech = folded.text
    if not speech.strip():
        raise ValueError("nothing is left of the speech once the characters this model does "
                         "not know are dropped")
    kept = session.fit(speech)
    if len(kept) < len(speech) or unread:
        note(f"the speech is {len(speech) + unread:,} characters, more than the {session.room} "
             f"a turn holds in this model's context of {session.model.config.block_size}: only "
             f"its last {len(kept):,} are read")
    return kept


def speak(session: Any, speech: str) -> None:
    """Print the reply to ``speech`` as it is sampled, then a line break; a note if the reply
    filled the context."""
    def show(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    session.reply(speech, on_text=show)
    show("\n")
    if session.stop == "context":
        note(f"the reply was stopped where the context of {session.model.config.block_size} "
             "ends")


def run_chat(args: argparse.Namespace, argv: list[str]) -> int:
    """``tinygpt chat``: one reply to a piped speech, or the interactive loop at a terminal; an
    error about a sampling setting ends with its option's name."""
    if sys.stdin is None:
        raise ValueError("stdin is closed: pipe a speech to tinygpt chat, or run it at a "
                         "terminal")
    with sampling_options.naming_the_option(OPTION_NAMES):
        session = open_session(args)
    with cpu_threads(session):
        return reply_or_interact(session)


def cpu_threads(session: Any) -> contextlib.AbstractContextManager:
    """``runtime.free_threads()`` for a session on the CPU (the cores free now), else nothing."""
    from tinygpt.runtime import free_threads

    on_cpu = next(session.model.parameters()).device.type == "cpu"
    return free_threads() if on_cpu else contextlib.nullcontext()


def reply_or_interact(session: Any) -> int:
    """One reply to the speech piped in, or the loop at a terminal."""
    if not sys.stdin.isatty():
        text, total = read_speech(sys.stdin, 8 * session.room + 1024)
        unread = total - len(text)  # the characters of the input before those kept
        trimmed = text.rstrip("\n")
        if not unread:
            trimmed = trimmed.lstrip("\n")
        offset = unread + len(text.rstrip("\n")) - len(trimmed)
        if not trimmed.strip():
            raise ValueError("the input is empty: pipe a speech to reply to, e.g. "
                             "echo 'To be, or not to be' | tinygpt chat CHECKPOINT")
        speak(session, prepare(session, trimmed, offset + 1, unread))
        return 0
    return interact(session)


def interact(session: Any) -> int:
    """The loop at a terminal; returns 0 when the user ends it."""
    with contextlib.suppress(ImportError):  # Windows: input() without line editing
        import readline  # noqa: F401  # importing it gives input() line editing and history
    print(f"You speak as {session.speaker}; {session.replier} replies. Type a speech and press "
          "Enter; /help lists the commands.")
    while True:
        try:
            line = input(f"{session.speaker}> ")
        except KeyboardInterrupt:
            print("^C")
            continue
        except EOFError:
            print()
            return 0
        command = line.strip()
        if command == "/quit":
            return 0
        if command == "/help":
            print(HELP)
            continue
        if command == "/clear":
            session.clear()
            print("(a new conversation)")
            continue
        if command.startswith("/") and " " not in command:
            print(f"tinygpt: unknown command {command}; {HELP}")
            continue
        if not command:
            continue
        try:
            speak(session, prepare(session, line))
        except KeyboardInterrupt:
            session.stopped()
            print("\n(reply stopped)", flush=True)
        except ValueError as err:  # a special token, nothing left of the speech
            print(f"tinygpt: {err}", flush=True)
