"""The speedrun on the book's corpus (``speedrun.py --book``): what chapter 8's speedrun page shows.

On the book's corpus and split (``tinygpt.book.trained_model.book_data()``: the complete plays, V =
70, the last 10% for validation), in one run and one torch thread:

* the baseline: nanoGPT's baby recipe (``speedrun.BABY`` / ``BABY_TRAIN``: 4 layers, width 128,
  context 64, batch 12, learning rate 1e-3 decayed to 1e-4 after 100 warm-up steps, 2000
  steps), trained by ``tinygpt.train.train``;
* then one change at a time toward the book's recipe (``BOOK_RECIPE``): first the optimizer's
  settings (peak learning rate, its floor, warm-up, betas, weight decay), then the context, then
  the model's shape (when it differs), then the batch and the number of steps, which make it the
  book's recipe. Each intermediate recipe is trained in full; the last row is the book's model,
  as ``book_model()`` returns it (loaded from the cache, or trained and cached).

A recipe's time is its median time per step times its steps. The step times are taken at the
end, for all recipes in the same rounds (3 rounds of ``--book-timing-steps`` steps of each
recipe in turn), so that the load of the moment falls on all of them alike; the full runs' own
times, taken while the machine did other things, are kept as ``run_median_ms`` and
``run_train_s``.

Every row records its validation estimates (``train``'s, ``eval_iters`` batches, at the book
recipe's ``eval_interval``) against steps and seconds of training (evaluations left out), its
training loss (means of 10 steps), and its loss over the whole validation split
(``tinygpt.book.scoring.score``). The result is written to ``benchmarks/results/speedrun.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from tinygpt.book.scoring import score
from tinygpt.book.trained_model import BOOK_RECIPE, book_data, book_model
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.train import train

RESULT = Path(__file__).parent / "results" / "speedrun.json"

# the changes from the baseline to the book's recipe, in the order the table applies them
OPTIMIZER = ("learning_rate", "min_lr", "warmup_iters", "lr_decay_iters", "beta1", "beta2",
             "weight_decay", "grad_clip")
STAGES = [
    ("learning rate and schedule", "train", OPTIMIZER),
    ("context", "model", ("block_size",)),
    ("model shape", "model", ("n_layer", "n_head", "n_embd", "mlp_hidden", "activation", "bias",
                              "norm", "norm_position", "positional", "tie_weights", "dropout")),
    ("batch and steps", "train", ("batch_size", "grad_accum_steps", "max_iters")),
]


def describe(model: GPTConfig, cfg: TrainConfig) -> dict:
    """The settings a reader compares, in one flat dict."""
    return {"n_layer": model.n_layer, "n_head": model.n_head, "n_embd": model.n_embd,
            "block_size": model.block_size, "batch_size": cfg.batch_size,
            "max_iters": cfg.max_iters, "learning_rate": cfg.learning_rate, "min_lr": cfg.min_lr,
            "warmup_iters": cfg.warmup_iters, "beta2": cfg.beta2,
            "weight_decay": cfg.weight_decay}


def ladder(baseline: tuple[GPTConfig, TrainConfig]) -> list[tuple[str, GPTConfig, TrainConfig]]:
    """The baseline, then each stage of ``STAGES`` that changes something, applied in turn."""
    book_m, book_t = BOOK_RECIPE.model, BOOK_RECIPE.train
    model, cfg = baseline
    rows = [("baseline: nanoGPT's baby recipe", model, cfg)]
    for name, which, fields in STAGES:
        source = book_m if which == "model" else book_t
        current = model if which == "model" else cfg
        changes = {f: getattr(source, f) for f in fields
                   if getattr(current, f) != getattr(source, f)}
        if not changes:
            continue
        if which == "model":
            model = replace(model, **changes)
        else:
            cfg = replace(cfg, **changes)
        rows.append((name, model, cfg))
    if (model, cfg) != (book_m, book_t):
        raise SystemExit("the stages do not lead to BOOK_RECIPE: a field is missing from STAGES")
    return rows


def curves(history: list[dict], tokens_per_step: int) -> dict:
    """Validation estimates against step and seconds of training (the step-0 evaluation of the
    untrained model at 0 s); the training loss in means of 10 steps."""
    seconds, elapsed, val, losses, step_s = 0.0, [], [], [], []
    for r in history:
        if "tokens_per_s" in r:  # a training step (the step-0 record is an evaluation only)
            step_s.append(tokens_per_step / r["tokens_per_s"])
            seconds += step_s[-1]
            elapsed.append(seconds)
            losses.append(r["loss"])
        if "val_loss" in r:
            val.append([r["step"], round(seconds, 2), round(r["val_loss"], 4)])
    train_curve = [[i + 10, round(elapsed[i + 9], 2), round(statistics.fmean(losses[i:i + 10]), 4)]
                   for i in range(0, len(losses) - 9, 10)]
    return {"val": val, "train": train_curve, "median_ms": 1000 * statistics.median(step_s),
            "train_s": sum(step_s)}


def step_times(model_config: GPTConfig, cfg: TrainConfig, train_ids, val_ids,
               steps: int) -> list[float]:
    """The milliseconds of each of the first ``steps`` training steps of this recipe (the first
    step, which warms up, left out)."""
    short = replace(cfg, max_iters=steps, lr_decay_iters=cfg.lr_decay_iters or cfg.max_iters,
                    eval_interval=10 ** 9)
    history = train(model_config, short, train_ids, val_ids, progress=False)
    tokens = cfg.sequences_per_step * model_config.block_size
    return [1000 * tokens / r["tokens_per_s"] for r in history[2:] if "tokens_per_s" in r]


def timed(recipes: list[tuple[GPTConfig, TrainConfig]], train_ids, val_ids, steps: int,
          rounds: int = 3) -> list[float]:
    """Each recipe's median milliseconds per step, from ``rounds`` rounds of ``steps`` steps of
    every recipe in turn: the machine's load of the moment falls on all of them alike."""
    times: list[list[float]] = [[] for _ in recipes]
    for _ in range(rounds):
        for i, (model_config, cfg) in enumerate(recipes):
            times[i] += step_times(model_config, cfg, train_ids, val_ids, steps)
    return [statistics.median(t) for t in times]


def run_book(baseline: tuple[GPTConfig, TrainConfig], timing_steps: int, argv: list[str],
             keep: bool = False) -> dict:
    """Train the ladder of recipes, write ``RESULT`` and return it. ``keep``: reuse the rows of
    an earlier, interrupted run (``RESULT`` with ``"partial"``) whose settings are the same."""
    earlier = {}
    if keep and RESULT.exists():
        done = json.loads(RESULT.read_text())
        earlier = {(r["change"], json.dumps(r["settings"])): r for r in done["rows"]
                   if r["source"] == "trained here"}
    tok, train_ids, val_ids = book_data(BOOK_RECIPE.corpus)
    load_start = os.getloadavg()
    started = time.perf_counter()
    book_t = BOOK_RECIPE.train  # evaluations, logging and seed as the book's run has them
    same = {f: getattr(book_t, f) for f in ("eval_interval", "eval_iters", "log_interval", "seed",
                                            "save_every", "device", "dtype")}
    baseline = (replace(baseline[0], vocab_size=tok.vocab_size), replace(baseline[1], **same))
    rows = []
    for name, model_config, cfg in ladder(baseline):
        tokens_per_step = cfg.sequences_per_step * model_config.block_size
        kept = earlier.get((name, json.dumps(describe(model_config, cfg))))
        if kept is not None:
            kept = {**kept, "kept_from_an_earlier_run": True}
            if "run_median_ms" not in kept:  # recorded before step times were taken in rounds
                kept["run_median_ms"], kept["run_train_s"] = kept.pop("median_ms"), \
                    kept.pop("train_s")
            rows.append(kept)
            print(f"{name}: kept from the earlier run", flush=True)
            continue
        if (model_config, cfg) == (BOOK_RECIPE.model, BOOK_RECIPE.train):
            book = book_model(progress=False)
            c = curves(book.history, tokens_per_step)
            val_loss, source = book.val_loss, "book_model()"
        else:
            torch.manual_seed(cfg.seed)
            model = GPT(model_config)
            history = train(model_config, cfg, train_ids, val_ids, model=model, progress=False)
            c = curves(history, tokens_per_step)
            val_loss, source = score(model, val_ids, model_config.block_size), "trained here"
        c["run_median_ms"], c["run_train_s"] = c.pop("median_ms"), c.pop("train_s")
        row = {"change": name, "settings": describe(model_config, cfg), "source": source,
               "tokens": tokens_per_step * cfg.max_iters, "val_loss": val_loss,
               "load_after": [round(v, 2) for v in os.getloadavg()], **c}
        rows.append(row)
        _write({"partial": True, "rows": rows})  # what is done so far survives a failure
        print(f"{name}: whole-split val loss {val_loss:.4f} ({source})", flush=True)
    # the time of a step, for every recipe in the same rounds (the runs above took turns with
    # whatever else the machine did; their own times are kept as run_median_ms, run_train_s)
    recipes = [(m, t) for _, m, t in ladder(baseline)]
    for row, (_, t), ms in zip(rows, recipes, timed(recipes, train_ids, val_ids, timing_steps)):
        row["median_ms"], row["time_s"] = ms, ms * t.max_iters / 1000
        print(f"{row['change']}: median {ms:.1f} ms/step x {t.max_iters} = {row['time_s']:.1f} s",
              flush=True)
    result = {
        "command": "python benchmarks/speedrun.py " + " ".join(argv),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
                   f"torch {torch.__version__}, {torch.get_num_threads()} torch thread(s)",
        "load_start": [round(v, 2) for v in load_start],
        "load_end": [round(v, 2) for v in os.getloadavg()],
        "wall_s": time.perf_counter() - started,
        "corpus": BOOK_RECIPE.corpus, "vocab_size": tok.vocab_size,
        "train_tokens": len(train_ids), "val_tokens": len(val_ids),
        "book_recipe": {"model": dataclasses.asdict(BOOK_RECIPE.model),
                        "train": dataclasses.asdict(BOOK_RECIPE.train)},
        "rows": rows,
    }
    _write(result)
    print(f"written: {RESULT.relative_to(Path(__file__).parent.parent)}", file=sys.stderr)
    return result


def _write(result: dict) -> None:
    """Write ``RESULT`` atomically (a new file, then renamed into place)."""
    RESULT.parent.mkdir(exist_ok=True)
    tmp = RESULT.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, RESULT)
