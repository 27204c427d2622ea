"""Chapter 12's ablation: GPT-2's design against each change since, on the book's corpus.

On the book's corpus and split (``tinygpt.book.trained_model.book_data()``), in one run, this
trains:

* the baseline: the book's recipe (``BOOK_RECIPE``: GPT-2's design -- learned positions,
  LayerNorm, GELU, AdamW -- 2 blocks of width 128, context 128, batches of 16, learning rate
  4e-3 with a cosine decay to 0), shortened to ``--steps`` steps (the decay ends there);
* the same recipe with one modern change at a time (``VARIANTS``: RoPE, ReLU², QK-norm,
  zero-initialised output projections, RMSNorm, Muon);
* all of the changes together.

Every ``--check-every`` steps the loss over a fixed slice of the validation split (its first
``--check-chars`` characters, every prediction, ``tinygpt.book.scoring.score``) is recorded; the
target is the loss the baseline reaches at its last step, and a run's *steps to target* is the
first check at or below it. A step's time is measured apart, for all the recipes in the same
rounds (``_bookrun.timed``: 3 rounds of ``--timing-steps`` steps of each recipe in turn), so
that the load of the moment falls on all of them alike; *time to target* is steps to target
times that median step time. Each run's loss over the whole validation split at its last step is
recorded too.

The result -- command, machine, target, and per run its changes, curve, steps and time to
target -- is written only when asked: ``--record`` replaces ``benchmarks/results/modern.json``,
the committed record chapter 12 reads; ``--out PATH`` writes it elsewhere. Without either it is
printed and nothing is written.

Usage: python benchmarks/modern.py --record   (about 12 minutes on one core, on a quiet machine)
       python benchmarks/modern.py --steps 60 --check-every 20 --out /tmp/m.json  (a quick check)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from _bookrun import timed  # benchmarks/_bookrun.py: step times in shared rounds

from tinygpt.book.scoring import score
from tinygpt.book.trained_model import BOOK_RECIPE, book_data
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.train import train

RESULT = Path(__file__).parent / "results" / "modern.json"

# (name, changes to GPTConfig, changes to TrainConfig): one change each, then all of them
CHANGES = [
    ("RoPE", {"positional": "rope"}, {}),
    ("ReLU²", {"activation": "relu2"}, {}),
    ("QK-norm", {"qk_norm": True}, {}),
    ("zero-init projections", {"zero_init_proj": True}, {}),
    ("RMSNorm", {"norm": "rmsnorm"}, {}),
    ("Muon", {}, {"optimizer": "muon"}),
]
BASELINE = "GPT-2 (the book's recipe)"
ALL = "all together"


def variants(model: GPTConfig, cfg: TrainConfig) -> list[tuple[str, GPTConfig, TrainConfig]]:
    """The baseline, each change of ``CHANGES`` alone, then all of them together."""
    rows = [(BASELINE, model, cfg)]
    rows += [(f"+ {name}", replace(model, **m), replace(cfg, **t)) for name, m, t in CHANGES]
    every_m = {k: v for _, m, _ in CHANGES for k, v in m.items()}
    every_t = {k: v for _, _, t in CHANGES for k, v in t.items()}
    rows.append((ALL, replace(model, **every_m), replace(cfg, **every_t)))
    return rows


def steps_to_target(curve: list[list[float]], target: float) -> int | None:
    """The first step of ``curve`` (rows ``[step, loss]``) whose loss is ``<= target``."""
    return next((int(step) for step, loss in curve if loss <= target), None)


def run_one(model_config: GPTConfig, cfg: TrainConfig, train_ids, val_ids, check_ids,
            check_every: int) -> dict:
    """Train one recipe; the checked loss every ``check_every`` steps and the whole-split one."""
    torch.manual_seed(cfg.seed)
    model = GPT(model_config)
    curve = [[0, score(model, check_ids, model_config.block_size)]]

    def check(record: dict, m: GPT) -> None:
        if record["step"] % check_every == 0 or record["step"] == cfg.max_iters:
            curve.append([record["step"], score(m, check_ids, model_config.block_size)])

    start = time.perf_counter()
    history = train(model_config, cfg, train_ids, val_ids, model=model, progress=False,
                    callback=check)
    wall = time.perf_counter() - start
    tokens = cfg.sequences_per_step * model_config.block_size
    step_ms = [1000 * tokens / r["tokens_per_s"] for r in history if "tokens_per_s" in r]
    return {"curve": [[s, round(v, 4)] for s, v in curve],
            "val_loss": score(model, val_ids, model_config.block_size),
            "run_median_ms": statistics.median(step_ms), "wall_s": wall}


def ours(path: Path) -> bool:
    """Whether ``path`` is missing or a result this script wrote (the only file it replaces)."""
    if not path.exists():
        return True
    try:
        done = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(done, dict) and str(done.get("command", "")).startswith(
        "python benchmarks/modern.py")


def parser() -> argparse.ArgumentParser:
    """The benchmark's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1000, help="steps of every run (1000)")
    p.add_argument("--check-every", type=int, default=50, help="steps between checks (50)")
    p.add_argument("--check-chars", type=int, default=32_768,
                   help="characters of the validation split a check scores (32768)")
    p.add_argument("--timing-steps", type=int, default=40,
                   help="steps per recipe and round (40)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--record", action="store_true",
                       help=f"replace the committed record {RESULT.name}, which chapter 12 reads")
    where.add_argument("--out", type=Path, default=None,
                       help="write the result there (default: nothing is written)")
    return p


def output(args: argparse.Namespace) -> Path | None:
    """Where the result is written: the record with ``--record``, ``--out``, else nowhere."""
    return RESULT if args.record else args.out


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    out = output(args)
    for name in ("steps", "check_every", "check_chars", "timing_steps", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if out is not None and not ours(out):
        p.error(f"--out {out} exists and is not a result of benchmarks/modern.py; "
                "it is left alone: choose another path")
    torch.set_num_threads(args.threads)
    tok, train_ids, val_ids = book_data(BOOK_RECIPE.corpus)
    check_ids = val_ids[:args.check_chars]
    base_t = replace(BOOK_RECIPE.train, max_iters=args.steps, lr_decay_iters=args.steps,
                     eval_interval=10 ** 9)  # no estimates of train's own: the checks are ours
    recipes = variants(BOOK_RECIPE.model, base_t)
    load_start, started, rows = os.getloadavg(), time.perf_counter(), []
    for name, m, t in recipes:
        r = run_one(m, t, train_ids, val_ids, check_ids, args.check_every)
        rows.append({"name": name, "model": asdict(m), "optimizer": t.optimizer, **r})
        print(f"{name}: checked loss {r['curve'][-1][1]:.4f} at step {args.steps}, whole split "
              f"{r['val_loss']:.4f} ({r['wall_s']:.0f} s)", flush=True)
    ms = timed([(m, t) for _, m, t in recipes], train_ids, val_ids, args.timing_steps)
    target = rows[0]["curve"][-1][1]  # the baseline's last checked loss
    for row, row_ms in zip(rows, ms):
        steps = steps_to_target(row["curve"], target)
        row.update(median_ms=row_ms, steps_to_target=steps,
                   time_to_target_s=None if steps is None else steps * row_ms / 1000)
        print(f"{row['name']}: {row_ms:.1f} ms/step, target {target:.4f} at step {steps}",
              flush=True)
    result = {
        "command": "python benchmarks/modern.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
                   f"torch {torch.__version__}, {torch.get_num_threads()} torch thread(s)",
        "load_start": [round(v, 2) for v in load_start],
        "load_end": [round(v, 2) for v in os.getloadavg()],
        "wall_s": time.perf_counter() - started, "steps": args.steps,
        "check_every": args.check_every, "check_chars": len(check_ids),
        "vocab_size": tok.vocab_size, "target": target, "rows": rows,
    }
    if out is None:
        print(f"not written (--record replaces {RESULT}, --out PATH writes elsewhere)",
              file=sys.stderr)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    print(f"written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
