"""Which kind of play is a speech from? Four classifiers side by side
(``tinygpt.book.evaluations.compute_genre_comparison``).

Training speeches come from 29 plays, test speeches from 9 others (3 comedies, 3 histories,
3 tragedies, ``genre.held_out_titles``). Compared: naive Bayes on words, a linear probe on the
frozen book model, full fine-tuning of the book model, and LoRA on it -- test accuracy with a
95% Wilson interval, trainable parameters and seconds (one torch thread).

    python benchmarks/genre_classification.py [--draws N] [--out FILE.json]

With ``--draws N`` the comparison is repeated on N draws of the test plays (seeds 0 to N-1), and
each draw's accuracies are printed and recorded: how much the ranking depends on which plays
were held out (chapter 14). The record is written only where ``--out`` says.

The seconds depend on the machine and its load (recorded), the accuracies only on the seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

from tinygpt.book.evaluations import compute_genre_draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    parser.add_argument("--draws", type=int, default=1,
                        help="how many draws of the test plays (default 1: the book's)")
    args = parser.parse_args()
    if args.draws < 1:
        parser.error(f"--draws must be at least 1, got {args.draws}")
    record = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                         f"Python {platform.python_version()}, torch {torch.__version__}",
              "load_before": round(os.getloadavg()[0], 2)}
    draws = compute_genre_draws(args.draws)
    record |= draws[0]  # the book's draw, as chapter 14 shows it
    if args.draws > 1:
        record["draws"] = [{"draw": d["draw"], "test_plays": d["test_plays"],
                            "accuracy": {row["method"]: row["accuracy"]["value"]
                                         for row in d["rows"]}} for d in draws]
    record["load_after"] = round(os.getloadavg()[0], 2)
    for d in draws:
        print(f"draw {d['draw']}: {', '.join(d['test_plays'])}")
        for row in d["rows"]:
            acc, play = row["accuracy"], row["play_interval"]
            print(f"  {row['method']:22s} {acc['value']:.3f} by play [{play['low']:.3f}, "
                  f"{play['high']:.3f}]  {row['trainable']:>9,} trainable  "
                  f"{row['seconds']:6.1f} s")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
