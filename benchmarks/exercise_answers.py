"""The measurements behind three of chapter 8's exercise solutions: warm-up, clipping, dropout.

Each exercise asks a question that only runs can answer, and one seed is an anecdote, so each
setting runs at three seeds (the seed sets the initial weights and the batches) with
``tinygpt.train.train`` on the book's split, one torch thread:

* **warm-up**: the chapter's model, 100 steps at a peak learning rate of 1e-2 and of 3e-3, with
  ``warmup_iters`` 0 and 50: the worst (highest) and the last training loss of each run;
* **clipping**: the chapter's first run (400 steps) with ``grad_clip`` 1.0 and 0 (no clipping):
  the last validation estimate of each;
* **dropout**: the over-fitting run (600 steps on the first 5,000 training characters) with
  dropout 0 and 0.2: the lowest validation estimate, its step, and the last one.

    python benchmarks/exercise_answers.py [--out benchmarks/results/exercise_answers.json]

The losses depend only on the seeds (and, in the last digits, on the CPU); the record holds the
command, the machine and its load. Chapter 8's solutions read the committed record.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from tinygpt.book.trained_model import book_data
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.train import train

SEEDS = (0, 1, 2)


def warm_up(vocab_size: int, train_ids: torch.Tensor, val_ids: torch.Tensor) -> list[dict]:
    model = GPTConfig(vocab_size=vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128)
    rows = []
    for peak in (1e-2, 3e-3):
        for warmup in (0, 50):
            for seed in SEEDS:
                cfg = TrainConfig(batch_size=16, max_iters=100, learning_rate=peak,
                                  min_lr=peak / 10, warmup_iters=warmup, eval_interval=100,
                                  eval_iters=5, seed=seed)
                losses = [r["loss"] for r in train(model, cfg, train_ids, val_ids,
                                                   progress=False) if "loss" in r]
                rows.append({"peak_lr": peak, "warmup_iters": warmup, "seed": seed,
                             "worst_loss_after_10": max(losses[10:]),
                             "last_loss": losses[-1]})
    return rows


def clipping(vocab_size: int, train_ids: torch.Tensor, val_ids: torch.Tensor) -> list[dict]:
    model = GPTConfig(vocab_size=vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128)
    base = TrainConfig(batch_size=16, max_iters=400, learning_rate=3e-3, min_lr=3e-4,
                       warmup_iters=40, eval_interval=50, eval_iters=20)
    rows = []
    for clip in (1.0, 0.0):
        for seed in SEEDS:
            history = train(model, replace(base, grad_clip=clip, seed=seed), train_ids,
                            val_ids, progress=False)
            evals = [r for r in history if "val_loss" in r]
            rows.append({"grad_clip": clip, "seed": seed, "last_val_loss": evals[-1]["val_loss"]})
    return rows


def dropout(vocab_size: int, train_ids: torch.Tensor, val_ids: torch.Tensor) -> list[dict]:
    tiny_text = train_ids[:5000]
    base = TrainConfig(batch_size=16, max_iters=600, learning_rate=3e-3, min_lr=1e-3,
                       warmup_iters=20, eval_interval=25, eval_iters=10)
    rows = []
    for rate in (0.0, 0.2):
        model = GPTConfig(vocab_size=vocab_size, block_size=32, n_layer=2, n_head=4, n_embd=64,
                          dropout=rate)
        for seed in SEEDS:
            history = train(model, replace(base, seed=seed), tiny_text, val_ids, progress=False)
            evals = [r for r in history if "val_loss" in r]
            best = min(evals, key=lambda r: r["val_loss"])
            rows.append({"dropout": rate, "seed": seed, "best_val_loss": best["val_loss"],
                         "best_step": best["step"], "last_val_loss": evals[-1]["val_loss"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tok, train_ids, val_ids = book_data()
    record = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                         f"Python {platform.python_version()}, torch {torch.__version__}",
              "load_before": round(os.getloadavg()[0], 2), "seeds": list(SEEDS)}
    start = time.perf_counter()
    for name, measure in (("warm_up", warm_up), ("clipping", clipping), ("dropout", dropout)):
        record[name] = measure(tok.vocab_size, train_ids, val_ids)
        for row in record[name]:
            print(name, {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    record["seconds"] = round(time.perf_counter() - start)
    record["load_after"] = round(os.getloadavg()[0], 2)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
