"""The command line: ``tinygpt train`` and ``tinygpt sample`` (also ``python -m tinygpt``).

It handles ``tinygpt train`` (read a text file or a named corpus, split it, build a character or
BPE tokenizer, call ``tinygpt.train.train``; ``--resume`` continues the checkpoint in ``--out``)
and ``tinygpt sample`` (load a checkpoint, encode the prompt, call ``tinygpt.sample.generate``,
print). The model and training options are generated from the fields of ``GPTConfig`` and
``TrainConfig`` (``dataclass_options``): kebab case, nanoGPT's spelling where ours differs
(``--lr``, ``--gradient-accumulation-steps``), help from the "Attributes:" sections of their
docstrings -- a field added to a config is an option with no change here. A user's mistake
prints ``tinygpt: error: <message>`` and gives exit code 2 (1 when training diverged); Ctrl-C
gives 130 at any moment (torch is imported inside ``main``, so even the first second is
covered); a closed stdout (``tinygpt sample | head``) ends quietly with 141, the code of a
command ended by a closed pipe; ``main`` returns the code instead of exiting. The checks made
before any work (devices, seeds, memory estimates) live in ``tinygpt.cli_checks``.

It does not train, sample, tokenize or save anything itself, and knows nothing of ``torchrun``:
``tinygpt train`` is a plain call of ``train``, so it runs wherever ``train`` runs.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import math
import re
import shlex
import sys
import time
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tinygpt
from tinygpt import cli_checks
from tinygpt.config import GPTConfig
from tinygpt.data import DATASETS, load_text, split_train_val

if typing.TYPE_CHECKING:  # torch is imported inside main, where Ctrl-C is caught
    from tinygpt.config import TrainConfig

SKIPPED = {"vocab_size"}  # comes from the tokenizer
SPELLINGS = {"learning_rate": ("--lr", "--learning-rate"),  # nanoGPT's name first
             "grad_accum_steps": ("--gradient-accumulation-steps", "--grad-accum-steps")}
CLI_DEFAULTS = {"block_size": 64, "batch_size": 12}  # nanoGPT's baby GPT, see EPILOG
CORPORA = ("shakespeare", *(name for name in DATASETS if "/" not in name))
DEFAULT_BPE_VOCAB = 512
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


# --- options from dataclasses --------------------------------------------------------------------

def attribute_docs(cls: type) -> dict[str, str]:
    """``{field: text}`` from the "Attributes:" section of ``cls``'s docstring (Google style):
    entries ``name: text`` or ``a, b: text``, continued on more indented lines."""
    _, found, section = inspect.cleandoc(cls.__doc__ or "").partition("Attributes:\n")
    docs: dict[str, str] = {}
    names: list[str] = []
    indent = None
    for line in (section if found else "").splitlines():
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        if depth < indent:  # the next section
            break
        entry = re.match(r"(\w+(?:, *\w+)*): +(.*)", line.strip())
        if depth == indent and entry:
            names = [n.strip() for n in entry[1].split(",")]
            docs.update(dict.fromkeys(names, entry[2]))
        else:
            docs.update({n: f"{docs[n]} {line.strip()}" for n in names})
    return {name: text.replace("``", "") for name, text in docs.items()}


def option_flags(name: str) -> tuple[str, ...]:
    """The option strings of field ``name``: nanoGPT's spelling where ours differs, else kebab."""
    return SPELLINGS.get(name, ("--" + name.replace("_", "-"),))


def _converter(hint: Any) -> tuple[Callable[[str], Any] | None, tuple[Any, ...] | None, str]:
    """``(type function, choices, metavar)`` for a type hint; no function means a bool flag."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(rest) < len(typing.get_args(hint))
        hint = rest[0] if len(rest) == 1 else str
    choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None
    hint = type(choices[0]) if choices else hint
    if hint is bool:
        return None, None, ""
    base = hint if hint in (int, float, str) else ast.literal_eval  # tuples, lists...

    def convert(text: str) -> Any:
        return None if optional and text.lower() == "none" else base(text)

    name = getattr(base, "__name__", "value")
    convert.__name__ = name + (" or 'none'" if optional else "")  # argparse's "invalid ... value"
    return convert, choices, name.upper() + ("|none" if optional else "")


def dataclass_options(group: Any, cls: type, defaults: dict[str, Any] | None = None) -> None:
    """Add an option for each init field of dataclass ``cls`` (but ``SKIPPED``) to ``group``.

    An option is absent from the parsed namespace unless given (``argparse.SUPPRESS``), so
    ``--resume`` can tell what was asked for; its help is the docstring's text and the default
    (from ``defaults``, else the field's).
    """
    hints, docs, defaults = typing.get_type_hints(cls), attribute_docs(cls), defaults or {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name in SKIPPED:
            continue
        default = defaults.get(f.name, f.default)
        own = f"; {cls.__name__}'s own: {f.default}" if f.name in defaults else ""
        text = docs.get(f.name, f.name.replace("_", " ")).replace("%", "%%")
        shown = "none" if default is None else default
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                                  "help": f"{text} (default: {shown}{own})"}
        convert, choices, metavar = _converter(hints[f.name])
        if convert is None:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(type=convert, choices=choices, metavar=None if choices else metavar)
        group.add_argument(*option_flags(f.name), **kwargs)


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init and f.name not in SKIPPED]


def _add(group: Any, flag: str, help: str, shown: object = None, **kwargs: Any) -> None:
    """An option whose help ends with its default (``shown``, else ``default``), if it has one."""
    if not kwargs.get("required") and kwargs.get("action") != "store_true":
        shown = kwargs.get("default") if shown is None else shown
        help += f" (default: {'none' if shown is None else shown})"
    group.add_argument(flag, help=help, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The ``tinygpt`` parser with its ``train`` and ``sample`` commands."""
    from tinygpt.config import TrainConfig

    parser = argparse.ArgumentParser(prog="tinygpt", description="Train a small GPT on a text "
                                     "and sample from it.")
    parser.add_argument("--version", action="version", version=f"tinygpt {tinygpt.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{train,sample}")
    train = commands.add_parser("train", help="train a GPT on a text file or a corpus",
                                description="Train a GPT and save its checkpoint in --out.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    io = train.add_argument_group("data and output")
    _add(io, "--data", f"a UTF-8 text file or a corpus name ({', '.join(CORPORA)})",
         required=True, metavar="FILE|NAME")
    _add(io, "--tokenizer", "char: one token per character of the text; bpe: byte-level BPE "
         "learned on the training part", shown="char", choices=("char", "bpe"))
    _add(io, "--vocab-size", "the BPE tokenizer's size, 256 bytes + merges (bpe only)",
         shown=DEFAULT_BPE_VOCAB, type=int, metavar="N")
    _add(io, "--val-fraction", "the last part of the text, held out for validation (resume "
         "with the same)", type=float, default=0.1, metavar="F")
    _add(io, "--out", "the checkpoint folder to write (or to resume)", required=True,
         metavar="DIR")
    _add(io, "--resume", "continue the checkpoint in --out with its model and tokenizer (same "
         "--data; --max-iters may be raised)", action="store_true")
    _add(io, "--overwrite", "replace the checkpoint in --out, or write one beside the files of a "
         "non-empty folder, instead of refusing (files tinygpt did not write are never touched)",
         action="store_true")
    _add(io, "--quiet", "no progress bar or evaluation lines, only the summary line",
         action="store_true")
    dataclass_options(train.add_argument_group("model (GPTConfig)"), GPTConfig, CLI_DEFAULTS)
    dataclass_options(train.add_argument_group("training (TrainConfig)"), TrainConfig,
                      CLI_DEFAULTS)
    train.set_defaults(run=run_train)

    sample = commands.add_parser("sample", help="print text generated from a checkpoint",
                                 description="Print text generated from a checkpoint.")
    _add(sample, "--out", "the checkpoint folder (train's --out)", required=True, metavar="DIR")
    _add(sample, "--prompt", "the text to continue (\\n: newline, \\t: tab); empty: start from a "
         "newline, which is not printed", shown="empty", default="", metavar="TEXT")
    for flag, kind, default, text in [
            ("--max-new-tokens", int, 500, "tokens to generate per sample"),
            ("--temperature", float, 0.8, "divides the logits; 0 is greedy"),
            ("--top-k", int, None, "keep the k most likely tokens (1 to the vocabulary size)"),
            ("--top-p", float, None, "keep the fewest likeliest tokens reaching probability p"),
            ("--seed", int, 1337, "seeds the sampling"),
            ("--num-samples", int, 1, "samples to print, separated by a line of dashes")]:
        _add(sample, flag, text, type=kind, default=default, metavar=kind.__name__.upper())
    _add(sample, "--no-cache", "recompute the whole context for every token instead of using "
         "the key/value cache (same text, slower)", action="store_true")
    _add(sample, "--stop", "end a sample after any of these strings; each must be one token "
         "(one character for a char tokenizer); \\n is a newline", shown="none", nargs="+",
         action="extend", default=[], metavar="STR")
    _add(sample, "--device", "cpu, cuda, cuda:N, mps or auto", default="cpu")
    sample.set_defaults(run=run_sample)
    return parser


# --- train ---------------------------------------------------------------------------------------

def read_data(spec: str) -> tuple[str, str]:
    """``(text, where)`` of ``--data``: a file's UTF-8 text, else a corpus of ``load_text``.

    The file's text is kept exactly: its line ends (``\\r\\n``, ``\\r``) are not translated.
    """
    path = Path(spec).expanduser()
    if not path.exists() and spec in CORPORA:
        return load_text(spec), f"the {spec} corpus"
    if not path.exists():
        raise ValueError(f"--data {spec}: no such file ({path.absolute()}); --data takes a UTF-8 "
                         f"text file or a corpus name: {', '.join(CORPORA)}")
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "is not a regular file (a device, FIFO, socket)"
        raise ValueError(f"--data {spec}: {what} ({path.absolute()}); --data takes a UTF-8 text "
                         "file or a corpus name")
    try:
        return path.read_bytes().decode("utf-8"), str(path)
    except PermissionError:
        raise ValueError(f"--data {path}: permission denied, cannot read it") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"--data {path}: not UTF-8 text ({err.reason} at byte "
                         f"{err.start})") from None


def _configs(args: argparse.Namespace, out: Path) -> tuple[GPTConfig, TrainConfig, Any]:
    """The model and training configs, and the tokenizer (None: to be built), of ``train``."""
    from tinygpt.checkpoint import META_FILE, load_checkpoint
    from tinygpt.config import TrainConfig
    from tinygpt.tokenizer import CharTokenizer

    given = vars(args)
    model_given = {n: given[n] for n in _fields(GPTConfig) if n in given}
    train_given = {n: given[n] for n in _fields(TrainConfig) if n in given}
    if not args.resume:
        if (out / META_FILE).exists() and not args.overwrite:
            raise ValueError(f"{out} already holds a checkpoint: continue it with --resume, or "
                             "replace it with --overwrite")
        lr = train_given.get("learning_rate", TrainConfig.learning_rate)
        if "min_lr" not in train_given and lr < TrainConfig.min_lr:
            train_given["min_lr"] = lr / 10  # the default min_lr would exceed lr
        pick = {**CLI_DEFAULTS, **model_given, **train_given}.items()
        return (GPTConfig(**{k: v for k, v in pick if k in _fields(GPTConfig)}),
                TrainConfig(**{k: v for k, v in pick if k in _fields(TrainConfig)}), None)
    ckpt = load_checkpoint(out)
    model_config, tokenizer = ckpt.model_config, ckpt.tokenizer
    for name, value in model_given.items():
        if value != getattr(model_config, name):
            raise ValueError(f"{option_flags(name)[0]} {value} contradicts the checkpoint in {out}"
                             f" ({name}={getattr(model_config, name)}); leave the model options "
                             "out when resuming")
    kind = "char" if isinstance(tokenizer, CharTokenizer) else "bpe"
    if tokenizer is None or args.tokenizer not in (None, kind) or args.vocab_size not in (
            None, tokenizer.vocab_size):
        have = f"a {kind} tokenizer of {tokenizer.vocab_size} tokens" if tokenizer else "none"
        raise ValueError(f"the checkpoint in {out} has {have}; resuming keeps it, so leave "
                         "--tokenizer and --vocab-size out")
    base = ckpt.train_config or TrainConfig(batch_size=CLI_DEFAULTS["batch_size"])
    train_config = dataclasses.replace(base, **train_given)
    if train_config.max_iters <= ckpt.step:
        raise ValueError(f"the checkpoint in {out} is at step {ckpt.step} already, the end of "
                         f"its run (--max-iters {train_config.max_iters}): --resume continues an "
                         "interrupted run on its own schedule; a longer run is a new run")
    return model_config, train_config, tokenizer


def run_train(args: argparse.Namespace, argv: list[str]) -> int:
    """``tinygpt train``: data, tokenizer and configs; call ``train``; print a summary line.

    ``--out`` is checked first (``tinygpt.ckptio.check_out_dir``: never a file, the data, the
    current folder, or a folder of other files without ``--overwrite``) and locked for the run.
    """
    from contextlib import nullcontext

    from tinygpt import ckptio
    from tinygpt.distributed import is_main_process

    out = ckptio.check_out_dir(args.out, data=args.data, resume=args.resume,
                               overwrite=args.overwrite)
    with ckptio.claim(out) if is_main_process() else nullcontext():  # rank 0 writes, under torchrun
        return _train_command(args, argv)


def _train_command(args: argparse.Namespace, argv: list[str]) -> int:
    """``run_train`` once ``--out`` is checked and locked."""
    import torch

    from tinygpt import train as train_module
    from tinygpt.checkpoint import load_checkpoint
    from tinygpt.distributed import is_main_process
    from tinygpt.tokenizer import BPETokenizer, CharTokenizer

    out, fraction = Path(args.out).expanduser(), args.val_fraction
    if not 0 < fraction < 1:
        raise ValueError(f"--val-fraction must be in (0, 1), got {fraction}")
    if args.vocab_size is not None and args.tokenizer != "bpe" and not args.resume:
        raise ValueError("--vocab-size needs --tokenizer bpe; a char tokenizer has one token "
                         "per character of the text")
    model_config, train_config, tokenizer = _configs(args, out)
    vocab = tokenizer.vocab_size if tokenizer else args.vocab_size or DEFAULT_BPE_VOCAB
    cli_checks.check_train_run(dataclasses.replace(model_config, vocab_size=vocab),
                               train_config)
    text, where = read_data(args.data)
    if not text:
        raise ValueError(f"{where} is empty: there is nothing to train on")
    try:
        train_text, val_text = split_train_val(text, fraction)
    except ValueError:  # too short to leave a validation part: reported below
        train_text, val_text = text, ""
    if tokenizer is None and args.tokenizer == "bpe":
        try:
            tokenizer = BPETokenizer.train(train_text, args.vocab_size or DEFAULT_BPE_VOCAB)
        except ValueError as err:
            raise ValueError(f"--vocab-size: {err}") from None
    elif tokenizer is None:
        tokenizer = CharTokenizer.from_text(text)
    try:
        train_ids, val_ids = tokenizer.encode(train_text), tokenizer.encode(val_text)
    except ValueError as err:  # a resumed char tokenizer meets a character it has not seen
        raise ValueError(f"{where} does not fit the checkpoint's tokenizer: {err}") from None
    need = model_config.block_size + 1  # one window of inputs and their next tokens, per part
    if min(len(train_ids), len(val_ids)) < need:
        total = math.ceil(need / min(fraction, 1 - fraction))
        raise ValueError(f"{where} holds {len(train_ids) + len(val_ids)} tokens: {len(train_ids)}"
                         f" for training and {len(val_ids)} for validation (--val-fraction "
                         f"{fraction}), but each part needs at least --block-size + 1 = {need}, "
                         f"about {total} in all: use a longer text or a smaller --block-size")
    model_config = dataclasses.replace(model_config, vocab_size=tokenizer.vocab_size)
    cli_checks.check_train_run(model_config, train_config)  # with the tokenizer's vocab_size
    start = time.perf_counter()
    try:
        history = train_module.train(
            model_config, train_config, torch.tensor(train_ids), torch.tensor(val_ids),
            out_dir=out, tokenizer=tokenizer, resume=args.resume, progress=not args.quiet)
    except KeyboardInterrupt:
        try:
            kept = f"the checkpoint of step {load_checkpoint(out).step} in {out} is kept"
        except ValueError:
            kept = "no checkpoint was saved"
        again = shlex.join(["tinygpt", *argv] + ([] if args.resume else ["--resume"]))
        if is_main_process():  # under torchrun, only rank 0 speaks
            print(f"tinygpt: interrupted; {kept}; continue with: {again}", file=sys.stderr)
        return 130
    last = [r for r in history if "val_loss" in r][-1]
    if is_main_process():  # every rank returns the same history; rank 0 reports it
        print(f"tinygpt: trained to step {last['step']} in {time.perf_counter() - start:.1f} s: "
              f"train loss {last['train_loss']:.4f}, val loss {last['val_loss']:.4f}; "
              f"checkpoint: {out}; try: tinygpt sample --out {shlex.quote(str(out))} "
              "--max-new-tokens 200")
    return 0


# --- sample --------------------------------------------------------------------------------------

def _unescape(text: str) -> str:
    """``\\n`` -> newline, ``\\t`` -> tab, ``\\\\`` -> backslash; nothing else changes."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m[1]], text)


def run_sample(args: argparse.Namespace, argv: list[str]) -> int:
    """``tinygpt sample``: load the checkpoint, encode the prompt, generate, print."""
    import torch

    from tinygpt import train as train_module
    from tinygpt.checkpoint import load_checkpoint
    from tinygpt.sample import generate

    cli_checks.check_sample_args(args)
    ckpt = load_checkpoint(args.out)
    tokenizer = ckpt.tokenizer
    if tokenizer is None:
        raise ValueError(f"the checkpoint in {args.out} holds no tokenizer to encode a prompt")
    prompt = _unescape(args.prompt)
    try:
        ids = tokenizer.encode(prompt or "\n")  # an empty prompt starts from a newline
    except ValueError as err:
        what = "--prompt" if prompt else "an empty --prompt starts from a newline, but"
        raise ValueError(f"{what}: {err}; give a --prompt made of its characters") from None
    stops = []
    for stop in args.stop:
        try:
            found = tokenizer.encode(_unescape(stop))
        except ValueError as err:
            raise ValueError(f"--stop {stop!r}: {err}") from None
        if len(found) != 1:
            raise ValueError(f"--stop {stop!r} is {len(found)} tokens of this tokenizer, not 1: "
                             "only single-token stop strings are supported")
        stops += found
    device = train_module.resolve_device(args.device)
    need = cli_checks.sample_memory(ckpt.model_config, args.num_samples, len(ids),
                                    args.max_new_tokens)
    cli_checks.check_memory(need, device.type if device.type == "cpu" else str(device),
                            "sampling", "lower --num-samples or --max-new-tokens")
    try:
        model = ckpt.model.to(device)
    except (RuntimeError, AssertionError) as err:  # a device this torch was not built for
        raise ValueError(f"--device {args.device}: {err}") from None
    idx = torch.tensor([ids] * args.num_samples, device=device)  # (B, T)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    out = generate(model, idx, args.max_new_tokens, args.temperature, args.top_k,
                   args.top_p, use_cache=not args.no_cache, generator=generator,
                   stop=stops or None)  # (B, T + n)
    for i, row in enumerate(out.tolist()):
        new = row[len(ids):]
        ends = [j for j, t in enumerate(new) if t in stops]
        new = new[:ends[0] + 1] if ends else new  # a finished row is padded with its stop id
        print(("-" * 15 + "\n") * (i > 0) + tokenizer.decode((ids if prompt else []) + new))
    return 0


# --- entry point ---------------------------------------------------------------------------------

def _explain(message: str) -> str:
    """Name the options of the fields a config's error message speaks of (learning_rate: --lr)."""
    if not re.search(r"\b(?:TrainConfig|GPTConfig)\.", message):
        return message
    from tinygpt.config import TrainConfig

    fields = _fields(GPTConfig) + _fields(TrainConfig)
    names = [n for n in fields if re.search(rf"\b{n}\b", message)]
    flags = ", ".join(option_flags(n)[0] for n in names)
    return f"{message} (option{'s' * (len(names) > 1)} {flags})" if names else message


def main(argv: list[str] | None = None) -> int:
    """Run ``tinygpt`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except KeyboardInterrupt:  # at any moment, the import of torch included
        print("tinygpt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout's reader went away: tinygpt sample | head
        return cli_checks.quiet_broken_pipe()


def _main(argv: list[str]) -> int:
    """``main`` without its handling of Ctrl-C and of a closed stdout."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version, or a usage error that argparse printed
        return done.code if isinstance(done.code, int) else 0 if done.code is None else 2
    if args.command is None:
        parser.print_help()
        return 0
    from tinygpt.train import TrainingDivergedError

    try:
        code = args.run(args, argv)
        sys.stdout.flush()  # a closed pipe shows here, not in Python's last flush at exit
        return code
    except TrainingDivergedError as err:
        print(f"tinygpt: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise
    except (ValueError, TypeError, OSError) as err:  # CheckpointError, DataNotFoundError...
        print(f"tinygpt: error: {_explain(str(err))}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as err:  # past the estimates of tinygpt.cli_checks
        if not isinstance(err, MemoryError) and not re.search(
                r"can't allocate memory|out of memory", str(err), re.IGNORECASE):
            raise
        print(f"tinygpt: error: out of memory ({type(err).__name__}); use smaller sizes",
              file=sys.stderr)
        return 2
