"""``tinygpt eval CHECKPOINT``: how well a checkpoint predicts a text, from the shell.

It handles the command: the text (``--data``: a UTF-8 file or a corpus name, by default the
book's plays), the part scored (``--split val``: the last ``--val-fraction``, cut as
``tinygpt train`` cuts it, so a checkpoint trained on that text is scored on what it did not
see; ``--split all``: the whole text, for a held-out file), and what is printed, a table or
``--json``:

- the loss over every next-token prediction of the part (``tinygpt.book.scoring.score``, the
  way the book scores every model), in nats per token and in bits per character (per byte of
  UTF-8 for a byte-level BPE tokenizer, whose tokens are bytes);
- ``--multiple-choice``: chapter 14's benchmark (``tinygpt.multiple_choice``), built from the
  part and the text before it, for each place a line is cut;
- ``--compression [KIND ...]``: what general compressors need for the same text, the baselines
  a model should beat: the conditional code length ``len(C(train + val)) - len(C(train))`` in
  bits per character (``compression_bits``; with ``--split all`` there is no training part and
  it is ``len(C(val))``) of gzip, bzip2 and xz (the standard library's; the default) and
  ``ppmd``, PPMd order 8 (``tinygpt.book.compression``, chapter 8's strongest compressor, met
  again in chapter 14: slower, and up to 256 MiB of memory); ``all`` is the four.

It does not train or sample. A character the tokenizer does not hold is refused with its
position in the file.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import math
from collections.abc import Callable
from typing import Any

from tinygpt.cli import preflight, sampling_options

COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda b: gzip.compress(b, compresslevel=9, mtime=0),
    "bzip2": lambda b: bz2.compress(b, compresslevel=9),
    "xz": lambda b: lzma.compress(b, preset=9 | lzma.PRESET_EXTREME),
}

PPMD, PPMD_ORDER = "ppmd", 8  # chapter 14's PPMd: variant H, contexts of up to 8 bytes

EPILOG = """\
examples:
  tinygpt eval out/shakespeare-char                       (the book's validation split)
  tinygpt eval out/notes --data notes.txt --multiple-choice --compression
  tinygpt eval out/notes --data notes.txt --compression ppmd xz
  tinygpt eval out/notes --data held-out.txt --split all --json
"""


def add_eval(commands: Any, add_option: Any) -> None:
    """Add the ``eval`` command to the ``tinygpt`` parser's ``commands``."""
    parser = commands.add_parser(
        "eval", help="a checkpoint's loss on a text (nats, bits per character)",
        description="Score a checkpoint on a text: its loss over every next-token prediction, "
        "in nats per token and bits per character (per byte for a byte-level tokenizer); "
        "optionally chapter 14's multiple-choice test and compression baselines.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint folder")
    add_option(parser, "--data", "a UTF-8 text file or a corpus name", default="shakespeare",
               metavar="FILE|NAME")
    add_option(parser, "--split", "val: the last --val-fraction of the text (as train cuts "
               "it); all: the whole text", default="val", choices=("val", "all"))
    add_option(parser, "--val-fraction", "the part held out for validation", type=float,
               default=0.1, metavar="F")
    add_option(parser, "--multiple-choice", "also chapter 14's multiple-choice test (a text in "
               "the plays' format: SPEAKER: lines, speeches between blank lines)",
               action="store_true")
    add_option(parser, "--questions", "multiple-choice questions per cut", type=int,
               default=500, metavar="INT")
    add_option(parser, "--compression", "also compression baselines: any of gzip, bzip2, xz, "
               "ppmd (PPMd order 8) or all; none named: gzip, bzip2 and xz", nargs="*",
               choices=(*COMPRESSORS, PPMD, "all"), metavar="KIND")
    add_option(parser, "--json", "print one JSON object instead of a table", action="store_true")
    add_option(parser, "--device", "cpu, cuda, cuda:N, mps or auto", default="cpu")
    parser.set_defaults(run=run_eval)


def compression_bits(train: str, val: str,
                     kinds: tuple[str, ...] = tuple(COMPRESSORS)) -> dict[str, float]:
    """Bits per character of ``val`` for each compressor of ``kinds`` (``COMPRESSORS``' names
    and ``ppmd``), given ``train`` before it: ``8 (len(C(train + val)) - len(C(train))) /
    len(val)`` (``len(C(val))`` if ``train`` is empty)."""
    if not val:
        raise ValueError("no text to compress")
    before, whole = train.encode("utf-8"), (train + val).encode("utf-8")
    out = {}
    for name in kinds:
        if name == PPMD:  # the book's PPMd, order 8, measured as the book measures it
            from tinygpt.book.compression import Compressor, code_length

            out[name] = code_length(Compressor("ppmd", order=PPMD_ORDER), val,
                                    train).bits_per_char
            continue
        compress = COMPRESSORS[name]
        extra = len(compress(whole)) - (len(compress(before)) if before else 0)
        out[name] = 8 * extra / len(val)
    return out


def compression_kinds(named: list[str] | None) -> tuple[str, ...]:
    """The compressors ``--compression`` names, in the table's order (none named: the three of
    the standard library; ``all``: those and PPMd)."""
    if named is None:
        return ()
    every = (*COMPRESSORS, PPMD)
    wanted = set(named or COMPRESSORS) if "all" not in named else set(every)
    return tuple(k for k in every if k in wanted)


def encode(tokenizer: Any, text: str, where: str, first: int = 0) -> list[int]:
    """``text``'s ids; a character the tokenizer lacks is refused with its position in the
    file (``text`` starts at its character ``first``, counted from 0)."""
    stoi = getattr(tokenizer, "stoi", None)
    if stoi is not None:
        bad = next((i for i, c in enumerate(text) if c not in stoi), None)
        if bad is not None:
            raise ValueError(f"{where}: {text[bad]!r} (character {first + bad + 1}) is not in the "
                             "checkpoint's vocabulary; score it on text made of its characters")
    return list(tokenizer.encode(text))


def run_eval(args: argparse.Namespace, argv: list[str]) -> int:
    """``tinygpt eval``: score, then print the table or the JSON object."""
    import torch

    from tinygpt.book.scoring import score
    from tinygpt.checkpoint import load_checkpoint
    from tinygpt.cli.train import read_data
    from tinygpt.data import split_train_val
    from tinygpt.runtime import resolve_device
    from tinygpt.tokenizer import CharTokenizer

    preflight.check_device(args.device)
    if not 0 < args.val_fraction < 1:
        raise ValueError(f"--val-fraction {args.val_fraction}: must be between 0 and 1")
    if args.questions < 1:
        raise ValueError(f"--questions {args.questions}: must be at least 1")
    ckpt = load_checkpoint(args.checkpoint)
    if ckpt.tokenizer is None:
        raise ValueError(f"the checkpoint in {args.checkpoint} holds no tokenizer to read a text")
    text, where = read_data(args.data)
    train, val = split_train_val(text, args.val_fraction) if args.split == "val" else ("", text)
    first = len(train)  # where the scored part starts in the text
    ids = encode(ckpt.tokenizer, val, f"--data {args.data}", first)
    if len(ids) < 2:
        raise ValueError(f"--data {args.data}: the {args.split} part is {len(ids)} token(s); "
                         "a loss needs at least 2")
    device = resolve_device(args.device)
    T = ckpt.model_config.block_size
    need = preflight.sample_memory(ckpt.model_config, 32, T, 0)
    preflight.check_memory(need, device.type if device.type == "cpu" else str(device),
                           "scoring", "use a smaller model or another --device")
    model = sampling_options.model_on_device(ckpt.model, device, args.device)
    nats = score(model, torch.tensor(ids), T)
    predictions = len(ids) - 1
    per_char = isinstance(ckpt.tokenizer, CharTokenizer)
    # the predictions cover the text after its first token: its characters, or its bytes
    covered = (len(val) - len(ckpt.tokenizer.decode(ids[:1])) if per_char else
               len(val.encode("utf-8")) - len(ckpt.tokenizer.decode(ids[:1]).encode("utf-8")))
    unit = "character" if per_char else "byte"
    result: dict[str, Any] = {
        "checkpoint": str(args.checkpoint), "step": ckpt.step, "data": where,
        "split": args.split, "characters": len(val), "tokens": len(ids),
        "loss_nats_per_token": nats,
        f"bits_per_{unit}": nats * predictions / max(covered, 1) / math.log(2),
    }
    if args.multiple_choice:
        result["multiple_choice"] = multiple_choice(model, ckpt.tokenizer, train, val, T,
                                                    args.questions, args.data)
    kinds = compression_kinds(args.compression)
    if kinds:
        result["compression_bits_per_character"] = compression_bits(train, val, kinds)
    print(json.dumps(result, indent=1) if args.json else table(result, unit))
    return 0


def multiple_choice(model: Any, tokenizer: Any, train: str, val: str, block_size: int,
                    size: int, data: str) -> dict[str, Any]:
    """Chapter 14's benchmark on ``val`` (its questions' lines not in ``train``), per cut."""
    import dataclasses

    from tinygpt import multiple_choice as mc

    found: dict[str, Any] = {}
    log_probs = mc.network_log_probs(model, block_size)
    for cut in mc.CUTS:
        try:
            questions = mc.build(val, train, cut=cut, size=size)
        except ValueError as err:
            raise ValueError(f"--multiple-choice: --data {data} has no speeches in the plays' "
                             "format (a SPEAKER: line, two lines of 20-80 characters) to ask "
                             f"about ({err})") from None
        found[cut] = {"questions": len(questions),
                      **dataclasses.asdict(mc.evaluate(log_probs, tokenizer, questions))}
    return found


def table(result: dict[str, Any], unit: str) -> str:
    """The human table of ``run_eval``'s result."""
    part = "validation split" if result["split"] == "val" else "whole text"
    rows = [("checkpoint", f"{result['checkpoint']} (step {result['step']})"),
            ("text", f"{result['data']}, {part} ({result['characters']:,} characters, "
                     f"{result['tokens']:,} tokens)"),
            ("loss", f"{result['loss_nats_per_token']:.4f} nats per token"),
            ("", f"{result[f'bits_per_{unit}']:.4f} bits per {unit}")]
    for cut, row in result.get("multiple_choice", {}).items():
        raw, norm = row["raw"], row["normalised"]
        rows.append((f"choice ({cut})", f"{raw['value']:.3f} raw [{raw['low']:.3f}, "
                     f"{raw['high']:.3f}], {norm['value']:.3f} per character, "
                     f"{row['questions']} questions (chance 0.25)"))
    for name, bits in result.get("compression_bits_per_character", {}).items():
        shown = f"PPMd order {PPMD_ORDER}" if name == PPMD else name
        rows.append((shown, f"{bits:.4f} bits per character"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
