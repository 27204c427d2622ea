"""Every rung of the book's loss ladder on the multiple-choice benchmark of
``tinygpt.multiple_choice``.

For each rung -- the counting models, the three small networks (trained by their ladder
recipe), the book's GPT untrained and trained -- and each kind of cut (inside a word, between
words, before the line), the accuracy by total and by per-character log-probability with its
95% Wilson interval, next to the rung's validation loss. What 0.1 nats buys, in right answers.

    python benchmarks/multiple_choice_ladder.py [--size 500] \
        [--out benchmarks/results/multiple_choice_ladder.json]

The accuracies do not depend on the machine or its load (everything is seeded; the networks
train on one thread); the seconds do. The record holds the command, the machine, its load and
each benchmark's fingerprint.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from tinygpt import multiple_choice as mc
from tinygpt.book import ladder, trained_model
from tinygpt.model import GPT
from tinygpt.ngram import NGramModel


def log_probs_of(key: str, train_ids: torch.Tensor, vocab_size: int) -> mc.LogProbs:
    """The log-probability function of ladder rung ``key``."""
    if key in ladder.COUNTING:
        n, smoothing = ladder.COUNTING[key]
        if n == 0:
            return mc.uniform_log_probs(vocab_size)
        return mc.ngram_log_probs(NGramModel(n, vocab_size, smoothing).fit(train_ids))
    if key in ladder.TRAINED:
        return mc.network_log_probs(ladder.train_rung(key).model, ladder.BLOCK_SIZE)
    config = trained_model.BOOK_RECIPE.model
    if key == "gpt_init":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(trained_model.BOOK_RECIPE.train.seed)
            return mc.network_log_probs(GPT(config), config.block_size)
    return mc.network_log_probs(trained_model.book_model(progress=False).model, config.block_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=500, help="questions per kind of cut")
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tok, train_ids, val_ids = trained_model.book_data(trained_model.BOOK_RECIPE.corpus)
    val, train = tok.decode(val_ids.tolist()), tok.decode(train_ids.tolist())
    benchmarks = {cut: mc.build(val, train, cut=cut, size=args.size) for cut in mc.CUTS}
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                   f"Python {platform.python_version()}, torch {torch.__version__}",
        "load_before": round(os.getloadavg()[0], 2),
        "version": mc.VERSION,
        "fingerprints": {cut: mc.fingerprint(qs) for cut, qs in benchmarks.items()},
        "questions": {cut: len(qs) for cut, qs in benchmarks.items()},
        "rungs": [],
    }
    for rung in ladder.RUNGS:
        start = time.perf_counter()
        log_probs = log_probs_of(rung.key, train_ids, tok.vocab_size)
        row = {"rung": rung.key, "chapter": rung.chapter, "val_loss": ladder.rung_loss(rung.key)}
        for cut, questions in benchmarks.items():
            row[cut] = dataclasses.asdict(mc.evaluate(log_probs, tok, questions))
        row["seconds"] = round(time.perf_counter() - start, 1)
        record["rungs"].append(row)
        print(f"{rung.key:15s} loss {row['val_loss']:.4f}  " + "  ".join(
            f"{cut} {row[cut]['raw']['value']:.3f}/{row[cut]['normalised']['value']:.3f}"
            for cut in mc.CUTS) + f"  ({row['seconds']} s)", flush=True)
    record["load_after"] = round(os.getloadavg()[0], 2)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
