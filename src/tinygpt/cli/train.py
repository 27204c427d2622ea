"""``tinygpt train``: from ``--data`` and the options to a call of ``tinygpt.train.train``.

It handles what the command does around the call: check and lock ``--out``, read the text (a
file or a named corpus), split it, build a character or BPE tokenizer, make the two configs
(or take them from the checkpoint with ``--resume``), refuse what cannot work before any work,
and print a summary line. Under ``torchrun`` every rank runs it; only rank 0 locks ``--out``
and prints. It does not train, tokenize or save anything itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinygpt.cli import preflight
from tinygpt.cli.options import config_fields, option_flags
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.data import DATASETS, load_text, split_train_val
from tinygpt.shards import is_shards_folder

if TYPE_CHECKING:
    from tinygpt.tokenizer import SavedTokenizer
    from tinygpt.train import TokenData

CLI_DEFAULTS = {"block_size": 64, "batch_size": 12}  # nanoGPT's baby GPT, see the help's epilog
CORPORA = ("shakespeare", *(name for name in DATASETS if "/" not in name))
DEFAULT_BPE_VOCAB = 512
DEFAULT_VAL_FRACTION = 0.1
TRAINED_ON = "trained_on"  # the history record (at step 1) of the data a run trains on


def read_data(spec: str) -> tuple[str, str]:
    """``(text, where)`` of ``--data``: a file's UTF-8 text (line ends kept), else a corpus."""
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


def configs_and_tokenizer(args: argparse.Namespace,
                          out: Path) -> tuple[GPTConfig, TrainConfig, Any, dict[str, Any]]:
    """The model and training configs of the run, the tokenizer (None: to be built), and what
    a resumed run was trained on (its ``TRAINED_ON`` record; empty for a new run, or one saved
    before tinygpt recorded it).

    A new run takes the options given over ``CLI_DEFAULTS`` and the configs' defaults; a resumed
    run takes the checkpoint's, refusing model or tokenizer options that contradict it.
    """
    from tinygpt.checkpoint import load_checkpoint
    from tinygpt.checkpoint.folder import MANIFEST
    from tinygpt.tokenizer import CharTokenizer

    given = vars(args)
    model_given = {n: given[n] for n in config_fields(GPTConfig) if n in given}
    train_given = {n: given[n] for n in config_fields(TrainConfig) if n in given}
    if not args.resume:
        if (out / MANIFEST).exists() and not args.overwrite:
            raise ValueError(f"{out} already holds a checkpoint: continue it with --resume, or "
                             "replace it with --overwrite")
        lr = train_given.get("learning_rate", TrainConfig.learning_rate)
        if "min_lr" not in train_given and lr < TrainConfig.min_lr:
            train_given["min_lr"] = lr / 10  # the default min_lr would exceed lr
        pick = {**CLI_DEFAULTS, **model_given, **train_given}.items()
        return (GPTConfig(**{k: v for k, v in pick if k in config_fields(GPTConfig)}),
                TrainConfig(**{k: v for k, v in pick if k in config_fields(TrainConfig)}), None,
                {})
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
    if "seed" in train_given and train_given["seed"] != base.seed:  # never used: RNGs restored
        raise ValueError(f"--seed {train_given['seed']} contradicts the checkpoint in {out} "
                         f"(seed={base.seed}): a resumed run continues its saved random states "
                         "and would not use it; leave --seed out when resuming")
    train_config = dataclasses.replace(base, **train_given)
    if train_config.max_iters <= ckpt.step:
        raise ValueError(f"the checkpoint in {out} is at step {ckpt.step} already, the end of "
                         f"its run (--max-iters {train_config.max_iters}): --resume continues an "
                         "interrupted run on its own schedule; a longer run is a new run")
    recorded = [r[TRAINED_ON] for r in ckpt.history if isinstance(r, dict)
                and isinstance(r.get(TRAINED_ON), dict)]
    return model_config, train_config, tokenizer, recorded[-1] if recorded else {}


def check_same_data(recorded: dict[str, Any], sha256: str, args: argparse.Namespace) -> None:
    """Refuse to resume on other data than the run's (``recorded``: its ``TRAINED_ON``)."""
    if recorded.get("sha256") not in (None, sha256):
        raise ValueError(f"--data {args.data} is not the data the checkpoint in {args.out} was "
                         "trained on (its SHA-256 differs): resume on the same data, or train "
                         "a new run on this one")


def data_recorder(args: argparse.Namespace, sha256: str,
                  fraction: float | None) -> Any:
    """``train``'s callback: a new run's first step records its data (``TRAINED_ON``), which
    ``--resume`` then checks."""
    def record(entry: dict[str, Any], model: Any) -> None:
        if not args.resume and entry["step"] == 1:
            entry[TRAINED_ON] = {"data": str(args.data), "sha256": sha256,
                                 "val_fraction": fraction}
    return record


def run_train(args: argparse.Namespace, argv: list[str]) -> int:
    """``tinygpt train``: check ``--out`` (``tinygpt.checkpoint.folder.check_out_dir``), lock it on
    rank 0
    for the run, and train (``train_into``); exit code 1 with one line if training diverges."""
    from contextlib import nullcontext

    from tinygpt.checkpoint.folder import check_out_dir, claim
    from tinygpt.checkpoint.run_state import TrainingDivergedError
    from tinygpt.distributed import is_main_process

    out = check_out_dir(args.out, data=args.data, resume=args.resume, overwrite=args.overwrite)
    try:
        with claim(out) if is_main_process() else nullcontext():  # rank 0 writes
            return train_into(args, argv)
    except TrainingDivergedError as err:
        print(f"tinygpt: error: {err}", file=sys.stderr)
        return 1


def train_into(args: argparse.Namespace, argv: list[str]) -> int:
    """Read, tokenize and split the data, check the run, call ``train``, print a summary line."""
    import torch

    from tinygpt import train as train_module
    from tinygpt.tokenizer import BPETokenizer, CharTokenizer

    out = Path(args.out).expanduser()
    if args.vocab_size is not None and args.tokenizer != "bpe" and not args.resume:
        raise ValueError("--vocab-size needs --tokenizer bpe; a char tokenizer has one token "
                         "per character of the text")
    model_config, train_config, tokenizer, recorded = configs_and_tokenizer(args, out)
    fraction = args.val_fraction
    before = recorded.get("val_fraction")
    if fraction is not None and before is not None and fraction != before:
        raise ValueError(f"--val-fraction {fraction} contradicts the checkpoint in {out} "
                         f"(trained with --val-fraction {before}): another split is other "
                         "training text; leave --val-fraction out when resuming")
    fraction = fraction if fraction is not None else before or DEFAULT_VAL_FRACTION
    if not 0 < fraction < 1:
        raise ValueError(f"--val-fraction must be in (0, 1), got {fraction}")
    vocab = tokenizer.vocab_size if tokenizer else args.vocab_size or DEFAULT_BPE_VOCAB
    preflight.check_train_run(dataclasses.replace(model_config, vocab_size=vocab),
                               train_config)
    if is_shards_folder(args.data):
        return run_from_shards(args, argv, model_config, train_config, tokenizer, train_module,
                               recorded)
    text, where = read_data(args.data)
    import hashlib

    sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    check_same_data(recorded, sha256, args)
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
        total = need / min(fraction, 1 - fraction)
        shown = f"{math.ceil(total)}" if total < 1e12 else f"{total:.3g}"  # not 300 digits
        raise ValueError(f"{where} holds {len(train_ids) + len(val_ids)} tokens: {len(train_ids)}"
                         f" for training and {len(val_ids)} for validation (--val-fraction "
                         f"{fraction}), but each part needs at least --block-size + 1 = {need}, "
                         f"about {shown} in all: use a longer text or a smaller --block-size")
    return run_training(args, argv, train_module, model_config, train_config, tokenizer,
                        torch.tensor(train_ids), torch.tensor(val_ids),
                        data_recorder(args, sha256, fraction))


def run_from_shards(args: argparse.Namespace, argv: list[str], model_config: GPTConfig,
                    train_config: TrainConfig, tokenizer: SavedTokenizer | None,
                    train_module: Any, recorded: dict[str, Any]) -> int:
    """Train on the memory-mapped shards of ``tinygpt prepare`` with their tokenizer."""
    from tinygpt.shards import TokenShards, load_shards_tokenizer, read_manifest

    manifest = read_manifest(args.data)
    if not args.resume and (args.tokenizer is not None or args.vocab_size is not None):
        raise ValueError(f"--data {args.data} is a shards folder with its own tokenizer: leave "
                         "--tokenizer and --vocab-size out")
    if args.val_fraction is not None:
        raise ValueError(f"--data {args.data} is a shards folder, split by tinygpt prepare: "
                         "leave --val-fraction out (prepare's --val-fraction sets it)")
    from tinygpt.tokenizer import tokenizer_fingerprint

    theirs = load_shards_tokenizer(args.data, manifest)
    if tokenizer is not None and tokenizer_fingerprint(tokenizer) != tokenizer_fingerprint(
            theirs):
        same = (type(tokenizer), tokenizer.vocab_size) == (type(theirs), theirs.vocab_size)
        raise ValueError(f"the checkpoint in {args.out} has a tokenizer of "
                         f"{tokenizer.vocab_size} tokens, the shards in {args.data} another"
                         f"{' of the same size but other tokens' if same else ''}: their ids "
                         "would mean other text; resume on the shards it was trained on")
    import hashlib
    import json

    listed = {k: manifest[k] for k in ("shards", "tokenizer")}  # each shard's SHA-256 in it
    sha256 = hashlib.sha256(json.dumps(listed, sort_keys=True).encode()).hexdigest()
    check_same_data(recorded, sha256, args)
    return run_training(args, argv, train_module, model_config, train_config, tokenizer or theirs,
                        TokenShards(args.data, "train"), TokenShards(args.data, "val"),
                        data_recorder(args, sha256, None))


def run_training(args: argparse.Namespace, argv: list[str], train_module: Any,
                 model_config: GPTConfig, train_config: TrainConfig, tokenizer: SavedTokenizer,
                 train_data: TokenData, val_data: TokenData, callback: Any = None) -> int:
    """Call ``train_module.train`` on the data, print a summary line (or how to resume)."""
    from tinygpt.checkpoint import load_checkpoint
    from tinygpt.distributed import is_main_process

    out = Path(args.out).expanduser()
    model_config = dataclasses.replace(model_config, vocab_size=tokenizer.vocab_size)
    preflight.check_train_run(model_config, train_config)  # with the tokenizer's vocab_size
    start = time.perf_counter()
    try:
        history = train_module.train(
            model_config, train_config, train_data, val_data,
            out_dir=out, tokenizer=tokenizer, resume=args.resume, progress=not args.quiet,
            callback=callback)
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
