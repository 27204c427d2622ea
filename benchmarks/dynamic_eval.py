"""Dynamic evaluation on the book's whole validation split: what learning while reading buys.

For a model, its static loss (``tinygpt.book.scoring.score``) and its dynamic loss
(``tinygpt.book.dynamic_eval.dynamic_score``: each window of ``block_size`` characters scored,
then one optimizer step on it; or each window in ``--parts`` pieces, a step after each; with
``--decay``, the weights pulled back towards the trained ones after each step) at each
learning rate asked for, beside PPMd order 8 on the
validation text alone (from ``benchmarks/results/compression.json``, the record of
``benchmarks/compression.py``), the compressor's own learning as it reads.

``--model book`` and ``--model modern`` are the book's cached models (trained first if they are
not cached: minutes on 2 cores); ``--model small`` trains the book's recipe for ``--steps`` steps
here (a quick anecdote, not the book's model). The learning rates are tried on the scoring split
itself: the best one is an optimistic pick, and the record says so. Everything runs on one
thread. The record is written to ``--out`` only with ``--write`` (otherwise printed).

``--model selection --row ROWS.jsonl:TAG:SEED`` reads a candidate that ``modern_book.py``
trained with ``"split": "selection"`` and ``"save"`` (the row of that tag and seed in its JSONL
file; its weights from the row's ``save``) and scores it on the **selection split** (the last 10%
of the training text, which it never read): the settings chosen there are an honest pick, and
the validation split is left for the score. ``--model book-selection`` trains the book's
recipe here on the first 90% of the training text and scores it on the same selection split
(the book's model's own settings, chosen honestly).

``--model modern --seeds 1337 1338 1339`` scores the modern book model trained with each seed
(as chapter 12 trains it, cached: ``benchmarks/modern_book.py --cpu-seeds`` trains the same
ones) at the modern model's own settings (``tinygpt.book.evaluations.DYNAMIC``, chosen on the
selection split): the spread of its static and dynamic losses over seeds.

Usage (a quiet machine): nice -n 10 python benchmarks/dynamic_eval.py --model book --write
       python benchmarks/dynamic_eval.py --model modern --write
       python benchmarks/dynamic_eval.py --model small --steps 600 --lr 1e-4,3e-4,1e-3
       python benchmarks/dynamic_eval.py --model book-selection --lr 1e-4,2e-4,3e-4,1e-3,3e-3
       python benchmarks/dynamic_eval.py --model selection --row ROWS.jsonl:TAG:SEED --write
       python benchmarks/dynamic_eval.py --model book-selection --lr 1e-4 --momentum 0 --parts 1,2,3
       python benchmarks/dynamic_eval.py --model book-selection --lr 1e-4 --momentum 0 --parts 3 \
           --decay 0,1e-4,3e-4 --beta2 0.999,0.9999
       python benchmarks/dynamic_eval.py --model modern --seeds 1337 1338 1339 --write
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch
from _machine import cpu_description  # benchmarks/_machine.py

from tinygpt import data
from tinygpt.book import trained_model
from tinygpt.book.dynamic_eval import dynamic_score
from tinygpt.book.scoring import score
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.files.writing import write_atomically
from tinygpt.model import GPT
from tinygpt.runtime import one_thread
from tinygpt.train import train

COMPRESSION = Path(__file__).resolve().parent / "results" / "compression.json"


def trained_book_recipe(cfg: TrainConfig, train_ids: torch.Tensor,
                        eval_ids: torch.Tensor) -> tuple[torch.nn.Module, float]:
    """The book's model trained here by ``cfg`` on ``train_ids`` (``eval_ids`` only for the
    losses it logs), and the seconds it took."""
    model_cfg = trained_model.BOOK_RECIPE.model
    torch.manual_seed(cfg.seed)
    model = GPT(model_cfg)
    start = time.perf_counter()
    train(model_cfg, cfg, train_ids, eval_ids, model=model, progress=False)
    return model.eval(), time.perf_counter() - start


def small_model(steps: int) -> tuple[torch.nn.Module, dict]:
    """The book's recipe cut to ``steps`` steps (its schedule shortened with it), trained here."""
    recipe = trained_model.BOOK_RECIPE
    cfg = dataclasses.replace(recipe.train, max_iters=steps, eval_interval=steps, eval_iters=2)
    _, train_ids, val_ids = trained_model.book_data(recipe.corpus)
    model, seconds = trained_book_recipe(cfg, train_ids, val_ids[:4096])
    return model, {"recipe": "BOOK_RECIPE with max_iters=" + str(steps), "train_s": seconds}


def book_selection_model() -> tuple[torch.nn.Module, dict]:
    """The book's recipe, whole, trained on the first 90% of the training text only: the last
    10% (the selection split) is left unread, for choosing dynamic evaluation's settings."""
    recipe = trained_model.BOOK_RECIPE
    _, train_ids, _ = trained_model.book_data(recipe.corpus)
    fit_ids, select_ids = data.split_train_val(train_ids)
    model, seconds = trained_book_recipe(recipe.train, fit_ids, select_ids)
    return model, {"recipe": "BOOK_RECIPE on the first 90% of the training text",
                   "train_s": seconds, "split": "selection (the last 10% of the training text)"}


def selection_model(row_spec: str) -> tuple[torch.nn.Module, dict]:
    """The candidate ``ROWS.jsonl:TAG:SEED`` of a ``modern_book.py`` sweep, with its weights."""
    path, tag, seed = row_spec.rsplit(":", 2)
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]
    row = next(r for r in rows if r.get("tag") == tag and r["seed"] == int(seed) and "save" in r)
    if row.get("split") != "selection":
        raise SystemExit(f"{row_spec}: not trained with the selection split held out")
    model = GPT(GPTConfig(**row["model"]))
    model.load_state_dict(torch.load(row["save"], weights_only=True))
    return model.eval(), {"recipe": row_spec, "selection_loss": row["selection_loss"],
                          "split": "selection (the last 10% of the training text)"}


def seed_spread(seeds: list[int]) -> dict:
    """The modern book model trained with each of ``seeds`` (cached, or trained here on the
    free cores) scored statically and dynamically at its settings (DYNAMIC) on the whole
    validation split, one thread: one row per seed, and each loss's mean, lowest and highest."""
    from tinygpt.book import evaluations

    _, _, val_ids = trained_model.book_data(trained_model.MODERN_RECIPE.corpus)
    rows = []
    for seed in seeds:
        recipe = dataclasses.replace(trained_model.MODERN_RECIPE, train=dataclasses.replace(
            trained_model.MODERN_RECIPE.train, seed=seed))
        found = trained_model.book_model(recipe, progress=False)
        start = time.perf_counter()
        with one_thread():
            got = dynamic_score(found.model, val_ids, recipe.model.block_size,
                                **evaluations.DYNAMIC["modern_model"])
        rows.append({"seed": seed, "static": found.val_loss, "dynamic": got.loss,
                     "train_s": found.train_s, "trained_on": found.machine,
                     "dynamic_s": time.perf_counter() - start})
        print(rows[-1], flush=True)
    summary = {name: {"mean": sum(r[name] for r in rows) / len(rows),
                      "low": min(r[name] for r in rows), "high": max(r[name] for r in rows)}
               for name in ("static", "dynamic")}
    return {"settings": evaluations.DYNAMIC["modern_model"], "rows": rows, **summary}


def save(record: dict, out: str, write: bool) -> None:
    """``record`` as JSON: written atomically to ``out`` if ``write``, else printed."""
    text = json.dumps(record, indent=1) + "\n"
    if write:
        write_atomically(text.encode("utf-8"), Path(out))
        print(f"wrote {out}")
    else:
        print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model",
                        choices=("book", "modern", "small", "selection", "book-selection"),
                        default="book")
    parser.add_argument("--row", help="--model selection: ROWS.jsonl:TAG:SEED")
    parser.add_argument("--steps", type=int, default=600, help="--model small: steps trained")
    parser.add_argument("--lr", default="1e-4,3e-4,1e-3", help="learning rates, comma-separated")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="adam")
    parser.add_argument("--windows", type=int, default=1, help="windows per chunk (per step)")
    parser.add_argument("--parts", default="1",
                        help="pieces each chunk is read in, a step after each, comma-separated; "
                             "each is tried with every --momentum and --lr")
    parser.add_argument("--momentum", default=None,
                        help="momenta (SGD's momentum, Adam's beta1), comma-separated; each is "
                             "tried with every --lr (default: torch's, 0 for SGD, 0.9 for Adam)")
    parser.add_argument("--decay", default="0",
                        help="pulls back towards the trained weights after each step (the "
                             "fraction of the way), comma-separated; each is tried with every "
                             "other setting")
    parser.add_argument("--beta2", default="0.999",
                        help="Adam's beta2 (its running RMS's memory), comma-separated; each is "
                             "tried with every other setting")
    parser.add_argument("--seeds", nargs="+", type=int,
                        help="--model modern: the seeds whose models are scored, at the book's "
                             "settings (--lr, --optimizer and --windows are not used)")
    parser.add_argument("--write", action="store_true", help="write the record to --out")
    parser.add_argument("--out", default=None,
                        help="default benchmarks/results/dynamic_eval_<model>.json")
    args = parser.parse_args()
    if args.seeds:
        if args.model != "modern":
            parser.error("--seeds goes with --model modern")
        record = {"command": "python " + " ".join(sys.argv),
                  "machine": f"{cpu_description()}, torch {torch.__version__}",
                  "load_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
                  **seed_spread(args.seeds),
                  "load_at_end": " ".join(f"{x:.2f}" for x in os.getloadavg())}
        save(record, args.out or "benchmarks/results/dynamic_eval_modern_seeds.json", args.write)
        return
    _, train_ids, val_ids = trained_model.book_data(trained_model.BOOK_RECIPE.corpus)
    with one_thread():
        if args.model in ("selection", "book-selection"):
            model, about = (selection_model(args.row) if args.model == "selection"
                            else book_selection_model())
            block = model.config.block_size
            val_ids = data.split_train_val(train_ids)[1]  # the selection split
        elif args.model == "small":
            model, about = small_model(args.steps)
            block = trained_model.BOOK_RECIPE.model.block_size
        else:
            recipe = trained_model.BOOK_RECIPE if args.model == "book" \
                else trained_model.MODERN_RECIPE
            found = trained_model.book_model(recipe)
            model, block = found.model.eval(), recipe.model.block_size
            about = {"recipe": dataclasses.asdict(recipe), "train_s": found.train_s,
                     "trained_on": found.machine}
        start = time.perf_counter()
        static = score(model, val_ids, block)
        record: dict = {
            "command": "python " + " ".join(sys.argv),
            "machine": f"{cpu_description()}, torch {torch.__version__}, one thread",
            "load_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "model": args.model, **about, "static_loss": static,
            "static_s": time.perf_counter() - start,
            "note": "the learning rates were tried on the selection split (the last 10% of "
                    "the training text, which this model never read): the lowest dynamic loss "
                    "is an honest pick for the validation split"
                    if "selection" in args.model else
                    "the learning rates were tried on the scored split itself: the lowest "
                    "dynamic loss is an optimistic pick",
            "dynamic": []}
        print(f"{args.model}: static {static:.4f} nats/char", flush=True)
        momenta = ([None] if args.momentum is None
                   else [float(v) for v in args.momentum.split(",")])
        settings = [(parts, momentum, float(lr), float(decay), float(beta2))
                    for parts in map(int, args.parts.split(",")) for momentum in momenta
                    for decay in args.decay.split(",") for beta2 in args.beta2.split(",")
                    for lr in args.lr.split(",")]
        for parts, momentum, lr, decay, beta2 in settings:
            start = time.perf_counter()
            got = dynamic_score(model, val_ids, block, lr, args.optimizer, args.windows,
                                momentum, parts, decay, beta2)
            record["dynamic"].append({"lr": lr, "optimizer": args.optimizer,
                                      "momentum": got.momentum,
                                      "windows_per_chunk": args.windows, "parts": parts,
                                      "decay": decay, "beta2": beta2,
                                      "loss": got.loss, "gain": static - got.loss,
                                      "seconds": time.perf_counter() - start})
            print(f"  {args.optimizer} lr {lr:g} momentum {got.momentum:g} beta2 {beta2:g} "
                  f"decay {decay:g}, {parts} part(s) a chunk: dynamic {got.loss:.4f} "
                  f"nats/char ({record['dynamic'][-1]['seconds']:.0f} s)", flush=True)
    # PPMd on the validation text alone: the committed record of benchmarks/compression.py
    rows = json.loads(COMPRESSION.read_text(encoding="utf-8"))["rows"]
    ppmd = next(row for row in rows if row["key"] == "ppmd8_alone")
    record["ppmd8_val_alone_nats_per_char"] = ppmd["nats_per_char"]
    print(f"PPMd order 8 on the validation text alone: {ppmd['nats_per_char']:.4f} nats/char")
    save(record, args.out or f"benchmarks/results/dynamic_eval_{args.model}.json", args.write)


if __name__ == "__main__":
    main()
