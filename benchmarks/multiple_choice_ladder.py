"""Every rung of the book's loss ladder on the multiple-choice benchmark of
``tinygpt.multiple_choice`` (``tinygpt.book.evaluations.compute_choice_ladder``).

For each rung -- the counting models, the three small networks (trained by their ladder
recipe), the book's GPT untrained and trained -- and each kind of cut (inside a word, between
words, before the line), the accuracy by total and by per-character log-probability with its
95% Wilson interval, next to the rung's validation loss: what 0.1 nats buys, in right answers.

    python benchmarks/multiple_choice_ladder.py [--size 500] \\
        [--out benchmarks/results/multiple_choice_ladder.json]

The accuracies do not depend on the machine or its load (everything is seeded; the networks
train on one thread); the seconds do. The record holds the command, the machine, its load and
each benchmark's fingerprint.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from tinygpt.book.evaluations import QUESTIONS, compute_choice_ladder
from tinygpt.multiple_choice import CUTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=QUESTIONS, help="questions per kind of cut")
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    record = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                         f"Python {platform.python_version()}, torch {torch.__version__}",
              "load_before": round(os.getloadavg()[0], 2)}
    start = time.perf_counter()
    record |= compute_choice_ladder(args.size)
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["load_after"] = round(os.getloadavg()[0], 2)
    for row in record["rows"]:
        print(f"{row['rung']:15s} loss {row['val_loss']:.4f}  " + "  ".join(
            f"{cut} {row[cut]['raw']['value']:.3f}/{row[cut]['normalised']['value']:.3f}"
            for cut in CUTS))
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
