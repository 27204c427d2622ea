"""The genre classifiers' learning rates, steps and LoRA rank, chosen on a selection split.

Chapter 14 fine-tunes the book model to tell a speech's kind of play (comedy, history,
tragedy), fully and with LoRA (``tinygpt.book.evaluations``: ``GENRE_TRAIN``, ``LORA_RANK``,
``LORA_TRAIN``, set to what this search chose). Those settings must not be chosen on the plays
the chapter scores. Here the chapter's training plays (every play but the nine test plays of
draw 0) are split again: two plays of each kind (``genre.held_out_titles`` with
``SELECTION_SEED``) are the selection split, the rest train. The test plays are never read.

The search goes one setting at a time, within the book's budget of at most 300 steps:
  1. the learning rate at 300 steps (full fine-tuning: 3e-4, 1e-3, 3e-3; LoRA rank 8: 1e-3,
     3e-3, 1e-2);
  2. at the best learning rate, 150 steps instead of 300, and LoRA ranks 4 and 16.
Each candidate's selection accuracy (speech level) is printed with its play-level 95% interval
(``tinygpt.significance.cluster_interval``: six plays, so the intervals are wide) and the paired
difference from the settings the book used before the search (``BEFORE``: full fine-tuning at
1e-3 and LoRA of rank 8 at 3e-3, 300 steps each, set by hand). The best accuracy wins, a tie
going to fewer steps and the smaller rank.

    python benchmarks/genre_selection.py [--jobs N] [--out FILE.json]   (~20 min on 2 cores)

One torch thread per candidate, ``--jobs`` candidates at a time. The accuracies depend only on
the seeds; the seconds on the machine and its load (recorded).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from tinygpt import genre, significance
from tinygpt.book import trained_model
from tinygpt.book.evaluations import GENRE_TRAIN
from tinygpt.lora import add_lora
from tinygpt.runtime import one_thread
from tinygpt.shakespeare import plays

SELECTION_SEED = 100  # not 0..N: the seeds that draw the test plays
SELECTION_PER_LABEL = 2
FULL_RATES = (3e-4, 1e-3, 3e-3)
LORA_RATES = (1e-3, 3e-3, 1e-2)
SHORTER_STEPS = 150
OTHER_RANKS = (4, 16)
STEPS = 300
BEFORE = {"full fine-tuning": {"rank": 0, "lr": 1e-3, "steps": STEPS},
          "LoRA": {"rank": 8, "lr": 3e-3, "steps": STEPS}}


def selection_split() -> tuple[list[genre.Example], list[genre.Example], tuple[str, ...]]:
    """The training examples, the selection examples and the selection plays' titles."""
    test_titles = set(genre.held_out_titles(plays(), seed=0))  # the book's test plays
    training_plays = [p for p in plays() if p.title not in test_titles]
    chosen = genre.held_out_titles(training_plays, per_label=SELECTION_PER_LABEL,
                                   seed=SELECTION_SEED)
    every = genre.examples(training_plays, length=trained_model.BOOK_RECIPE.model.block_size)
    train, selection = genre.split(every, chosen)
    return train, selection, chosen


def run(candidate: dict[str, Any]) -> dict[str, Any]:
    """Fine-tune the book model as ``candidate`` says and score it on the selection split."""
    train, selection, _ = selection_split()
    tokenizer = trained_model.book_data(trained_model.BOOK_RECIPE.corpus)[0]
    with one_thread():
        base = trained_model.book_model(progress=False).model
        config = dataclasses.replace(GENRE_TRAIN, learning_rate=candidate["lr"],
                                     max_iters=candidate["steps"])
        torch.manual_seed(config.seed)
        classifier = genre.SpeechClassifier(copy.deepcopy(base))
        if candidate["rank"]:
            add_lora(classifier.gpt, rank=candidate["rank"])
            classifier.head.requires_grad_(True)
        start = time.perf_counter()
        genre.fine_tune(classifier, train, tokenizer, config)
        predicted = torch.as_tensor(genre.predict(classifier, selection, tokenizer)).tolist()
    correct = [int(p == e.label) for p, e in zip(predicted, selection)]
    interval = significance.cluster_interval(correct, [e.title for e in selection])
    return {**candidate, "accuracy": interval.value, "play_low": interval.low,
            "play_high": interval.high, "seconds": round(time.perf_counter() - start, 1),
            "correct": correct}


def name(candidate: dict[str, Any]) -> str:
    method = f"LoRA rank {candidate['rank']}" if candidate["rank"] else "full fine-tuning"
    return f"{method}, lr {candidate['lr']:g}, {candidate['steps']} steps"


def run_all(candidates: list[dict[str, Any]], jobs: int) -> list[dict[str, Any]]:
    with ProcessPoolExecutor(jobs) as pool:
        done = list(pool.map(run, candidates))
    for row in done:
        print(f"  {name(row):40s} {row['accuracy']:.3f} by play [{row['play_low']:.3f}, "
              f"{row['play_high']:.3f}]  {row['seconds']:6.1f} s", flush=True)
    return done


def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The most accurate; a tie goes to fewer steps, then the smaller rank."""
    return max(rows, key=lambda r: (r["accuracy"], -r["steps"], -(r["rank"] or 0)))


def compared(row: dict[str, Any], current: dict[str, Any], plays_of: list[str]) -> dict[str, Any]:
    """The paired difference from the current setting, by play (sign-flip test)."""
    test = significance.paired_difference(row["correct"], current["correct"], plays_of)
    return {"candidate": name(row), "against": name(current), "difference": test.value,
            "low": test.low, "high": test.high, "p": test.p_value}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="candidates at a time (default 2)")
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    train, selection, chosen = selection_split()
    plays_of = [e.title for e in selection]
    record: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                   f"Python {platform.python_version()}, torch {torch.__version__}",
        "load_before": round(os.getloadavg()[0], 2), "selection_plays": list(chosen),
        "train_examples": len(train), "selection_examples": len(selection)}
    print(f"selection plays: {', '.join(chosen)} ({len(selection)} speeches; "
          f"{len(train)} training speeches)")
    steps = STEPS
    print("1. the learning rate")
    first = run_all([{"rank": 0, "lr": lr, "steps": steps} for lr in FULL_RATES]
                    + [{"rank": BEFORE["LoRA"]["rank"], "lr": lr, "steps": steps}
                       for lr in LORA_RATES],
                    args.jobs)
    full = best([r for r in first if not r["rank"]])
    lora = best([r for r in first if r["rank"]])
    print("2. fewer steps, other ranks")
    second = run_all([{**full, "steps": SHORTER_STEPS}, {**lora, "steps": SHORTER_STEPS}]
                     + [{"rank": rank, "lr": lora["lr"], "steps": steps}
                        for rank in OTHER_RANKS], args.jobs)
    rows = first + second
    key = ("rank", "lr", "steps")
    current_full, current_lora = (next(r for r in first if all(r[k] == v for k, v in
                                                               BEFORE[method].items()))
                                  for method in ("full fine-tuning", "LoRA"))
    chosen_full = best([r for r in rows if not r["rank"]])
    chosen_lora = best([r for r in rows if r["rank"]])
    record["candidates"] = [{k: r[k] for k in (*key, "accuracy", "play_low", "play_high",
                                              "seconds")} for r in rows]
    record["before"] = BEFORE
    record["chosen"] = {"full fine-tuning": {k: chosen_full[k] for k in key},
                        "LoRA": {k: chosen_lora[k] for k in key}}
    record["against_current"] = [compared(chosen_full, current_full, plays_of),
                                 compared(chosen_lora, current_lora, plays_of)]
    record["load_after"] = round(os.getloadavg()[0], 2)
    for line in record["against_current"]:
        print(f"chosen {line['candidate']} vs {line['against']}: {line['difference']:+.3f} "
              f"[{line['low']:+.3f}, {line['high']:+.3f}], p = {line['p']:.2f} (by play)")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
