"""``tinygpt prepare``: the options of the command and a summary line; the work is
``tinygpt.prepare.write_shards``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from tinygpt.prepare.documents import Options


def add_prepare(commands: Any, add_option: Any) -> None:
    """Add the ``prepare`` command to the ``tinygpt`` parser's ``commands``."""
    prepare = commands.add_parser(
        "prepare", help="tokenize text files into token shards for train --data",
        description="Make a tokenizer and token shards (raw uint16/uint32 .bin files and a "
        "shards.json manifest) from a text file, a folder of them or a glob; a file is a "
        "document, as is each <|endoftext|>-separated part of one. Re-running with the same "
        "inputs reuses the finished shards.")
    prepare.add_argument("inputs", help="a UTF-8 text file, a folder of them, or a quoted glob",
                         metavar="INPUT")
    add_option(prepare, "--out", "the shards folder to write", required=True, metavar="DIR")
    add_option(prepare, "--tokenizer", "char, bpe (learned on the training documents) or gpt2 "
               "(GPT-2's files)", default="bpe", choices=("char", "bpe", "gpt2"))
    add_option(prepare, "--vocab-size", "the BPE tokenizer's size: 256 bytes, merges and "
               "<|endoftext|>", default=Options.vocab_size, type=int, metavar="N")
    add_option(prepare, "--val-fraction", "the share of documents held out for validation",
               default=Options.val_fraction, type=float, metavar="F")
    add_option(prepare, "--seed", "seeds which documents are held out", default=Options.seed,
               type=int, metavar="N")
    add_option(prepare, "--shard-tokens", "tokens per shard", default=Options.shard_tokens,
               type=int, metavar="N")
    add_option(prepare, "--workers", "processes that encode", shown="all cores",
               default=os.cpu_count() or 1, type=int, metavar="N")
    add_option(prepare, "--overwrite", "replace the shards of other inputs in --out (only "
               "files prepare wrote)", action="store_true")
    add_option(prepare, "--quiet", "no progress bar", action="store_true")
    prepare.set_defaults(run=run_prepare)


def run_prepare(args: argparse.Namespace, argv: list[str]) -> int:
    """``tinygpt prepare``: write the shards, print one summary line."""
    from tinygpt.prepare import write_shards

    options = Options(args.tokenizer, args.vocab_size, args.val_fraction, args.seed,
                      args.shard_tokens)
    m = write_shards(args.inputs, args.out, options, workers=args.workers,
                     progress=not args.quiet, overwrite=args.overwrite)
    shards = {s: len(m["shards"][s]) for s in ("train", "val")}
    print(f"tinygpt: {args.out}: {m['tokens']['train']} training tokens in {shards['train']} "
          f"shard(s), {m['tokens']['val']} validation tokens in {shards['val']}, "
          f"{m['tokenizer']['type']} tokenizer of {m['vocab_size']} tokens; try: tinygpt train "
          f"--data {args.out} --out OUT")
    return 0
