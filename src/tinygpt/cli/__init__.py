"""The command line: ``tinygpt prepare``, ``train``, ``eval``, ``finetune``, ``sample``,
``chat`` and ``exercises`` (also ``python -m tinygpt``), one module per command beside this
one.

It handles the parser and the exit codes: ``build_parser`` makes the commands (the model and
training options come from ``GPTConfig`` and ``TrainConfig``, ``tinygpt.cli.options``), and
``main`` runs the function the chosen subcommand sets (``args.run``). A user's mistake prints
one line, ``tinygpt: error: <message>``, with exit code 2 (1 when training diverges,
``run_train``); Ctrl-C gives 130 at any moment (torch is imported inside ``main``); a closed
stdout (``tinygpt sample | head``) ends quietly with 141. ``main`` returns the code instead of
exiting. It does not train or sample itself; under ``torchrun`` each rank runs it.
"""

from __future__ import annotations

import argparse
import importlib
import re
import signal
import sys
import threading
from typing import Any

import tinygpt
from tinygpt.cli import preflight
from tinygpt.cli.chat import add_chat
from tinygpt.cli.evaluate import add_eval
from tinygpt.cli.exercises import add_exercises
from tinygpt.cli.finetune import add_finetune
from tinygpt.cli.options import dataclass_options, name_options
from tinygpt.cli.prepare import add_prepare
from tinygpt.cli.sample import run_sample
from tinygpt.cli.sampling_options import add_sampling_options
from tinygpt.cli.train import (
    CLI_DEFAULTS,
    CORPORA,
    DEFAULT_BPE_VOCAB,
    DEFAULT_VAL_FRACTION,
    run_train,
)
from tinygpt.config import GPTConfig, TrainConfig

EPILOG = """\
Defaults: nanoGPT's "baby GPT" CPU configuration for character-level Shakespeare: n_layer 4,
n_head 4, n_embd 128, block_size 64, batch_size 12, dropout 0, max_iters 2000, lr 1e-3 after
100 warm-up steps, cosine decay to min_lr 1e-4 at max_iters (lr / 10 for an --lr below 1e-4).
Only block_size and batch_size differ from GPTConfig's and TrainConfig's defaults (256, 32).

examples:
  tinygpt train --data shakespeare --tokenizer char --out out/shakespeare-char
  tinygpt train --data notes.txt --tokenizer bpe --vocab-size 1024 --out out/notes --max-iters 500
  tinygpt train --data shakespeare --out out/shakespeare-char --resume   (after an interruption)
"""


def add_option(group: Any, flag: str, help: str, shown: object = None, **kwargs: Any) -> None:
    """An option whose help ends with its default (``shown``, else ``default``), if it has one."""
    if not kwargs.get("required") and kwargs.get("action") != "store_true":
        shown = kwargs.get("default") if shown is None else shown
        help += f" (default: {'none' if shown is None else shown})"
    group.add_argument(flag, help=help, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The ``tinygpt`` parser with its ``train`` and ``sample`` commands."""
    parser = argparse.ArgumentParser(prog="tinygpt", description="Train a small GPT on a text "
                                     "and sample from it.")
    parser.add_argument("--version", action="version", version=f"tinygpt {tinygpt.__version__}")
    commands = parser.add_subparsers(dest="command",
                                     metavar="{prepare,train,eval,finetune,sample,chat,exercises}")
    train = commands.add_parser("train", help="train a GPT on a text file or a corpus",
                                description="Train a GPT and save its checkpoint in --out.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    io = train.add_argument_group("data and output")
    add_option(io, "--data", f"a UTF-8 text file, a folder of tinygpt prepare's shards or a "
         f"corpus name ({', '.join(CORPORA)})",
         required=True, metavar="FILE|NAME")
    add_option(io, "--tokenizer", "char: one token per character of the text; bpe: byte-level BPE "
         "learned on the training part", shown="char", choices=("char", "bpe"))
    add_option(io, "--vocab-size", "the BPE tokenizer's size, 256 bytes + merges (bpe only)",
         shown=DEFAULT_BPE_VOCAB, type=int, metavar="N")
    add_option(io, "--val-fraction", "the last part of the text, held out for validation (a "
         "resumed run keeps its own)", type=float, shown=DEFAULT_VAL_FRACTION, metavar="F")
    add_option(io, "--out", "the checkpoint folder to write (or to resume)", required=True,
         metavar="DIR")
    add_option(io, "--resume", "continue the checkpoint in --out with its model and tokenizer "
         "(same --data; --max-iters may be raised)", action="store_true")
    add_option(io, "--overwrite", "replace the checkpoint in --out, or write one beside the files "
         "of a non-empty folder, instead of refusing (files tinygpt did not write are never "
         "touched)",
         action="store_true")
    add_option(io, "--quiet", "no progress bar or evaluation lines, only the summary line",
         action="store_true")
    dataclass_options(train.add_argument_group("model (GPTConfig)"), GPTConfig, CLI_DEFAULTS)
    dataclass_options(train.add_argument_group("training (TrainConfig)"), TrainConfig,
                      CLI_DEFAULTS)
    train.set_defaults(run=run_train)

    sample = commands.add_parser("sample", help="print text generated from a checkpoint",
                                 description="Print text generated from a checkpoint.")
    add_option(sample, "--out", "the checkpoint folder (train's --out)", required=True,
         metavar="DIR")
    add_option(sample, "--prompt", "the text to continue (\\n: newline, \\t: tab); empty: start "
         "from a newline, which is not printed", shown="empty", default="", metavar="TEXT")
    add_option(sample, "--max-new-tokens", "tokens to generate per sample", type=int, default=500,
               metavar="INT")
    add_option(sample, "--num-samples", "samples to print, separated by a line of dashes",
               type=int, default=1, metavar="INT")
    add_option(sample, "--stop", "end a sample after any of these strings; each must be one token "
         "(one character for a char tokenizer); \\n is a newline", shown="none", nargs="+",
         action="extend", default=[], metavar="STR")
    add_sampling_options(sample, add_option, seed=1337)
    sample.set_defaults(run=run_sample)
    add_prepare(commands, add_option)
    add_exercises(commands, add_option)
    add_chat(commands, add_option)
    add_eval(commands, add_option)
    add_finetune(commands, add_option)
    return parser


def import_torch_holding_ctrl_c() -> None:
    """Import torch with SIGINT held back until the import is done, then delivered.

    A Ctrl-C inside numpy's import (torch imports it) can come out as an ImportError that torch
    catches: the interrupt would be lost, or a later import would fail.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(
            signal, "pthread_sigmask"):  # another thread, or Windows: cannot hold it back
        importlib.import_module("torch")
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        importlib.import_module("torch")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a held Ctrl-C arrives here


def main(argv: list[str] | None = None) -> int:
    """Run ``tinygpt`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    try:
        return parse_and_run(sys.argv[1:] if argv is None else list(argv))
    except KeyboardInterrupt:  # at any moment, the import of torch included
        print("tinygpt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout's reader went away: tinygpt sample | head
        return preflight.quiet_broken_pipe()


def disk_full(err: BaseException) -> str | None:
    """The message for a full disk (or quota), naming the file, instead of a bare
    ``[Errno 28] No space left on device``; None for any other error."""
    import errno

    if not isinstance(err, OSError) or err.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    what = "the disk is full" if err.errno == errno.ENOSPC else "the disk quota is exceeded"
    where = f" while writing {err.filename}" if err.filename else ""
    return (f"{what}{where}; the file was not written (what was written before is kept): free "
            "some space, or write to a folder on another disk (--out), then run the command "
            "again")


def parse_and_run(argv: list[str]) -> int:
    """``main`` without its handling of Ctrl-C and of a closed stdout."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version, or a usage error that argparse printed
        return done.code if isinstance(done.code, int) else 0 if done.code is None else 2
    if args.command is None:
        parser.print_help()
        return 0
    if sys.stdout is None:  # started with stdout closed (>&-): nowhere to write the output
        if sys.stderr is not None:
            print(f"tinygpt: error: stdout is closed: tinygpt {args.command} writes its output "
                  "there; give it a file, a pipe or a terminal", file=sys.stderr)
        return 2
    import_torch_holding_ctrl_c()
    try:
        code = args.run(args, argv)
        if sys.stdout is not None:
            sys.stdout.flush()  # a closed pipe shows here, not in Python's last flush at exit
        return code
    except BrokenPipeError:
        raise
    except (ValueError, TypeError, OSError) as err:  # CheckpointError, DataNotFoundError...
        message = disk_full(err) or name_options(err, GPTConfig, TrainConfig)
        print(f"tinygpt: error: {message}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as err:  # past the estimates of tinygpt.cli.preflight
        if not isinstance(err, MemoryError) and not re.search(
                r"can't allocate memory|out of memory", str(err), re.IGNORECASE):
            raise
        print(f"tinygpt: error: out of memory ({type(err).__name__}); use smaller sizes",
              file=sys.stderr)
        return 2
