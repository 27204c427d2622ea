"""Which kind of play is a speech from? Four classifiers side by side
(``tinygpt.book.evaluations.compute_genre_comparison``).

Training speeches come from 29 plays, test speeches from 9 others (3 comedies, 3 histories,
3 tragedies, ``genre.held_out_titles``). Compared: naive Bayes on words, a linear probe on the
frozen book model, full fine-tuning of the book model, and LoRA on it -- test accuracy with a
95% Wilson interval, trainable parameters and seconds (one torch thread).

    python benchmarks/genre_classification.py [--out benchmarks/results/genre_classification.json]

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

from tinygpt.book.evaluations import compute_genre_comparison


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    args = parser.parse_args()
    record = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                         f"Python {platform.python_version()}, torch {torch.__version__}",
              "load_before": round(os.getloadavg()[0], 2)}
    record |= compute_genre_comparison()
    record["load_after"] = round(os.getloadavg()[0], 2)
    for row in record["rows"]:
        acc = row["accuracy"]
        print(f"{row['method']:22s} {acc['value']:.3f} [{acc['low']:.3f}, {acc['high']:.3f}]  "
              f"{row['trainable']:>9,} trainable  {row['seconds']:6.1f} s")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
