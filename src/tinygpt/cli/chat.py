"""``tinygpt chat CHECKPOINT``: talk with a model fine-tuned to the chat template
(``tinygpt.chat``).

At a terminal it is a loop: a line typed (with readline's line editing and history, where
Python has readline) is a speech; the model's reply is printed; Ctrl-C drops the line being
typed or stops the reply being written, Ctrl-D (or ``/quit``) ends. Reading from a pipe, the
whole input is one speech and one reply is printed. The turns of one session stay in the
model's key/value cache (``tinygpt.chat.ChatSession``), on ``--device``. A checkpoint whose
tokenizer lacks the template's special tokens is refused with a clear error; so is a device this
machine lacks. The sampling options are those of ``tinygpt sample``
(``tinygpt.cli.sampling_options``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from tinygpt.cli import sampling_options

DESCRIPTION = """\
Talk with a model fine-tuned to the chat template of tinygpt.chat (for instance the book's
chat model of chapter 15, saved by tinygpt.book.chat_model.chat_model().save(FOLDER)). At a
terminal, type a speech and press Enter; Ctrl-C drops the line (or stops a reply), Ctrl-D or
/quit ends. From a pipe, the input is one speech and one reply is printed."""

# ChatSession's parameters and their options, to name the option in an error about one
OPTION_NAMES = {**sampling_options.OPTION_NAMES, "max_chars": "--max-chars"}

EPILOG = """\
examples:
  tinygpt chat out/chat-model
  tinygpt chat out/chat-model --as OPHELIA --temperature 0.6
  echo "To be, or not to be" | tinygpt chat out/chat-model
"""


def add_chat(commands: Any, add_option: Any) -> None:
    """Add the ``chat`` command to the ``tinygpt`` parser's ``commands``."""
    parser = commands.add_parser("chat", help="talk with a chat model (a checkpoint)",
                                 description=DESCRIPTION, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="the checkpoint folder of a model fine-tuned to chat")
    add_option(parser, "--as", "the speaker who replies, in capitals as the plays write names",
               shown="the model chooses", dest="replier", metavar="SPEAKER")
    add_option(parser, "--speaker", "your name in the conversation", default="HAMLET",
               metavar="NAME")
    add_option(parser, "--max-chars", "the longest reply, in characters", type=int, default=200,
               metavar="INT")
    sampling_options.add_sampling_options(parser, add_option, seed=0)
    parser.set_defaults(run=run_chat)


def open_session(args: argparse.Namespace) -> Any:
    """The ``ChatSession`` of the checkpoint and options in ``args``; a clear error for a
    checkpoint without a chat template."""
    from tinygpt.chat import SPECIAL_TOKENS, ChatSession, has_chat_template
    from tinygpt.checkpoint import load_checkpoint
    from tinygpt.runtime import resolve_device

    sampling_options.check_sampling_options(args)  # seed and device, before the checkpoint is read
    ckpt = load_checkpoint(args.checkpoint)
    if not has_chat_template(ckpt.tokenizer):
        raise ValueError(f"the checkpoint in {args.checkpoint} has no chat template: its "
                         f"tokenizer lacks the special tokens {' '.join(SPECIAL_TOKENS)}, so it "
                         "is a language model not fine-tuned to chat; use `tinygpt sample` with "
                         "it, or fine-tune it first (tinygpt.chat.fine_tune)")
    model = sampling_options.model_on_device(ckpt.model, resolve_device(args.device), args.device)
    return ChatSession(model, ckpt.tokenizer, speaker=args.speaker, replier=args.replier,
                       temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                       max_chars=args.max_chars, seed=args.seed, use_cache=not args.no_cache)


def run_chat(args: argparse.Namespace, argv: list[str]) -> int:
    """``tinygpt chat``: one reply to a piped speech, or the interactive loop at a terminal; an
    error about a sampling setting ends with its option's name."""
    with sampling_options.naming_the_option(OPTION_NAMES):
        session = open_session(args)
    if not sys.stdin.isatty():
        speech = sys.stdin.read().strip("\n")
        if not speech.strip():
            raise ValueError("the input is empty: pipe a speech to reply to, e.g. "
                             "echo 'To be, or not to be' | tinygpt chat CHECKPOINT")
        print(session.reply(speech))
        return 0
    return interact(session)


def interact(session: Any) -> int:
    """The loop at a terminal; returns 0 when the user ends it."""
    with contextlib.suppress(ImportError):  # Windows: input() without line editing
        import readline  # noqa: F401  # importing it gives input() line editing and history
    print(f"You speak as {session.speaker}. Type a speech and press Enter; Ctrl-C drops it, "
          "Ctrl-D or /quit ends.")
    while True:
        try:
            line = input(f"{session.speaker}> ")
        except KeyboardInterrupt:
            print("^C")
            continue
        except EOFError:
            print()
            return 0
        if line.strip() == "/quit":
            return 0
        if not line.strip():
            continue
        try:
            print(session.reply(line), flush=True)
        except KeyboardInterrupt:
            session.stopped()
            print("\n(reply stopped)", flush=True)
        except ValueError as err:  # a character the model does not know, a special token
            print(f"tinygpt: {err}", flush=True)
