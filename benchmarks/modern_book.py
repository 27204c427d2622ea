"""The modern book model's recipe, chosen by measurement (issue: the modern book model at 1.50).

The book's model (``BOOK_RECIPE``, chapter 8) trains for about three minutes on 2 CPU cores. The
modern book model gets the same budget -- the same corpus, split and whole-split scoring -- and
chapter 12's changes (RoPE, ReLU², QK-norm, zero-initialised projections, RMSNorm, Muon). Which
depth, width, context, batch and learning rate spend three minutes best is a search, and the
search runs in two places:

1. ``--time`` (on the CPU the budget is set on, 2 threads): the milliseconds per training step of
   every candidate *shape* (``SHAPES``), the median of ``--timing-steps`` steps; written to
   ``--timings``. Learning rates do not change a step's time, so shapes are timed once.
2. ``--train`` (anywhere, e.g. a GPU: the loss after N steps does not depend on the device that
   took them, up to rounding): every candidate (a shape from the timings and a learning rate from
   ``LEARNING_RATES``) trained for the number of steps the budget buys on that CPU
   (``--budget-s`` / its time per step, schedule decayed to 0 at that step), then scored on the
   whole validation split; ``--jobs`` candidates at a time, one process each. Written to
   ``--out``, one JSON object per candidate as it finishes.

Chapter 12's ``MODERN_RECIPE`` is the best candidate, retrained on the CPU by
``tinygpt.book.trained_model.book_model`` (which records its own time and loss); ``--cpu-seeds``
trains it with several seeds here, for the spread (``results/modern_book_seeds.json``), and
``--gpu-scale`` trains the book's recipe and the modern one at nanoGPT's shakespeare-char size.

Usage: python benchmarks/modern_book.py --cpu-seeds 1337 1338 1339   (about 10 minutes)
       python benchmarks/modern_book.py --time --timings benchmarks/results/modern_book_timings.json
       python benchmarks/modern_book.py --train --device cuda --jobs 12 --out sweep.jsonl
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
from _bookrun import step_times  # benchmarks/_bookrun.py
from _machine import cpu_description, cpu_label  # benchmarks/_machine.py
from _sweep import run_sweep  # benchmarks/_sweep.py
from levers_model import LeverGPT  # benchmarks/levers_model.py

from tinygpt import data
from tinygpt.book.scoring import score
from tinygpt.book.trained_model import BOOK_RECIPE, book_data
from tinygpt.config import GPTConfig, TrainConfig
from tinygpt.model import GPT
from tinygpt.train import train

MODERN_PARTS = {"positional": "rope", "activation": "relu2", "qk_norm": True,
                "zero_init_proj": True, "norm": "rmsnorm"}
# (n_layer, n_embd, n_head, block_size, batch_size): the shapes timed and searched
SHAPES = [(2, 128, 4, 128, 16), (2, 128, 4, 128, 32), (2, 128, 4, 256, 16), (2, 192, 6, 128, 16),
          (2, 256, 4, 128, 16), (3, 128, 4, 128, 16), (3, 192, 6, 128, 16), (4, 128, 4, 128, 16),
          (4, 128, 4, 64, 32), (3, 160, 5, 128, 16), (2, 160, 5, 128, 16), (2, 128, 4, 64, 32),
          (4, 192, 6, 128, 16), (6, 128, 4, 128, 16), (2, 128, 4, 128, 8), (3, 128, 4, 128, 32)]
LEARNING_RATES = (3e-3, 6e-3, 1e-2, 1.5e-2)


def shape_name(shape: tuple[int, ...]) -> str:
    n_layer, n_embd, n_head, block, batch = shape
    return f"L{n_layer}-C{n_embd}-H{n_head}-T{block}-B{batch}"


def configs(shape: tuple[int, ...], lr: float, steps: int, seed: int = 1337,
            device: str = "cpu", model_changes: dict | None = None,
            train_changes: dict | None = None) -> tuple[GPTConfig, TrainConfig]:
    """The modern model of this shape, and the book's training settings with Muon, ``lr`` and
    ``steps`` (warm-up 100 steps, cosine decay to 0 at the last step); then ``model_changes``
    and ``train_changes`` (fields of GPTConfig and TrainConfig that change no step's time)."""
    n_layer, n_embd, n_head, block, batch = shape
    model = replace(BOOK_RECIPE.model, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                    block_size=block, **MODERN_PARTS, **(model_changes or {}))
    cfg = replace(BOOK_RECIPE.train, batch_size=batch, max_iters=steps, lr_decay_iters=None,
                  learning_rate=lr, min_lr=0.0, optimizer="muon", seed=seed, device=device,
                  eval_interval=max(steps // 10, 1), **(train_changes or {}))
    return model, cfg


def time_shapes(args: argparse.Namespace) -> None:
    _, train_ids, val_ids = book_data()
    rows = {}
    load = os.getloadavg()
    for shape in SHAPES:
        model, cfg = configs(shape, 6e-3, 100)
        times = step_times(model, cfg, train_ids, val_ids, args.timing_steps)
        rows[shape_name(shape)] = {"shape": shape, "median_ms": statistics.median(times)}
        print(shape_name(shape), f"{rows[shape_name(shape)]['median_ms']:.1f} ms", flush=True)
    book = step_times(BOOK_RECIPE.model, BOOK_RECIPE.train, train_ids, val_ids,
                      args.timing_steps)
    out = {"command": "python " + " ".join(sys.argv), "machine": machine(),
           "threads": torch.get_num_threads(), "load_start": load, "load_end": os.getloadavg(),
           "book_recipe_ms": statistics.median(book), "shapes": rows}
    print(f"book recipe {out['book_recipe_ms']:.1f} ms")
    Path(args.timings).write_text(json.dumps(out, indent=1) + "\n")


def machine() -> str:
    return f"{cpu_description()}, torch {torch.__version__}, {platform.platform()}"


def run_one(job: dict) -> dict:
    """One candidate trained and scored. With ``"split": "selection"`` it trains on the first
    90% of the training text only and is chosen by its loss on the last 10% (the selection
    split, ``selection_loss``); the validation split, the one the book scores, is scored too for
    the record (``whole_val_loss``) but never read in training or used to choose. A job's
    ``"model_levers"`` (``{"value_embeddings": true, "unet_skips": true}``, say) trains a
    ``LeverGPT`` with them (``benchmarks/levers_model.py``); without it, the package's ``GPT``."""
    torch.set_num_threads(1)
    _, train_ids, val_ids = book_data()
    scored = {}
    if job.get("split") == "selection":
        train_ids, select_ids = data.split_train_val(train_ids)
    else:
        select_ids = val_ids
    model_cfg, cfg = configs(tuple(job["shape"]), job["lr"], job["steps"], job["seed"],
                             job["device"], job.get("model_changes"), job.get("train_changes"))
    torch.manual_seed(cfg.seed)
    start = time.perf_counter()
    levers = job.get("model_levers")
    model = GPT(model_cfg) if levers is None else LeverGPT(model_cfg, **levers)

    def report(record: dict, _: GPT) -> None:  # a run cut short still leaves its curve in the log
        if "val_loss" in record:
            print(f"{job['name']} lr {job['lr']:g} {job.get('tag', '')} step {record['step']} "
                  f"val {record['val_loss']:.4f}", flush=True)

    history = train(model_cfg, cfg, train_ids, select_ids, model=model, progress=False,
                    callback=report)
    seconds = time.perf_counter() - start
    if job.get("split") == "selection":
        scored["selection_loss"] = score(model, select_ids, model_cfg.block_size)
    if job.get("save"):  # the weights, for dynamic evaluation's settings (dynamic_eval.py)
        torch.save(model.state_dict(), job["save"])
    whole = score(model, val_ids, model_cfg.block_size)
    curve = [[r["step"], round(r["val_loss"], 4)] for r in history if "val_loss" in r]
    return {**job, **scored, "whole_val_loss": whole, "curve": curve, "seconds": seconds,
            "model": asdict(model_cfg), "train": asdict(cfg), "cpu": cpu_label(),
            "machine": cpu_description()}


def train_candidates(args: argparse.Namespace) -> None:
    timings = json.loads(Path(args.timings).read_text())
    jobs = []
    for name in [] if args.variants else args.shapes or timings["shapes"]:
        ms = timings["shapes"][name]["median_ms"]
        steps = int(args.budget_s * 1000 / ms)
        for lr in args.lrs or LEARNING_RATES:
            for seed in range(1337, 1337 + args.seeds):
                jobs.append({"name": name, "shape": timings["shapes"][name]["shape"], "lr": lr,
                             "steps": min(steps, args.max_steps), "cpu_ms": ms, "seed": seed,
                             "device": args.device})
    for extra in json.loads(args.variants) if args.variants else []:  # one run each
        entry = timings["shapes"][extra["name"]]
        steps = int(args.budget_s * 1000 / entry["median_ms"])
        jobs.append({"shape": entry["shape"], "steps": min(steps, args.max_steps),
                     "cpu_ms": entry["median_ms"], "seed": 1337, "device": args.device, **extra})
    run_sweep(run_one, jobs, args.jobs, args.out, describe)


def describe(row: dict) -> str:
    """One finished candidate, in a line."""
    chosen_on = (f"selection {row['selection_loss']:.4f}, " if "selection_loss" in row else "")
    return (f"{row['name']} lr {row['lr']:g} seed {row['seed']} steps {row['steps']} "
            f"{row.get('model_changes', '')} {row.get('train_changes', '')} "
            f"{row.get('model_levers', '')}: "
            f"{chosen_on}validation {row['whole_val_loss']:.4f} ({row['seconds']:.0f} s)")


SEEDS_RESULT = Path(__file__).parent / "results" / "modern_book_seeds.json"


def cpu_seeds(args: argparse.Namespace) -> None:
    """``MODERN_RECIPE`` trained here (as chapter 12 trains it, cached) with each seed of
    ``--cpu-seeds``: the spread of its whole-split loss; written to ``SEEDS_RESULT``."""
    from tinygpt.book.trained_model import MODERN_RECIPE, book_model

    runs = []
    for seed in args.cpu_seeds:
        recipe = replace(MODERN_RECIPE, train=replace(MODERN_RECIPE.train, seed=seed))
        load = os.getloadavg()
        run = book_model(recipe, progress=False)
        runs.append({"seed": seed, "whole_val_loss": run.val_loss, "train_s": run.train_s,
                     "trained_now": run.trained_now, "load_start": load,
                     "load_end": os.getloadavg()})
        print(runs[-1], flush=True)
    SEEDS_RESULT.write_text(json.dumps({"command": "python " + " ".join(sys.argv),
                                        "machine": machine(), "runs": runs}, indent=1) + "\n")


LEVERS_RESULT = Path(__file__).parent / "results" / "modern_book_levers.json"
UNNAMED_CPU = "an unnamed CPU"  # the CPU of a run recorded before runs named theirs
# what each tag of the selection-split sweeps changed, for the record and chapter 12's table
LEVERS = {
    "base": "MODERN_RECIPE as the validation-split search chose it",
    "lr7": "learning rate 0.007 (was 0.005)",
    "wsd0.3": "warm-up, stable, decay: the rate held, then a straight line down over the "
              "last 30% of the steps",
    "wsd0.5": "warm-up, stable, decay over the last 50%",
    "softcap15": "logit soft cap 15",
    "softcap8": "logit soft cap 8",
    "adam3": "AdamW part (embeddings, head, norms) at 3x the rate",
    "adam10": "AdamW part at 10x the rate",
    "adam0.3": "AdamW part at 0.3x the rate",
    "adam0.1": "AdamW part at 0.1x the rate",
    "wd0": "no weight decay",
    "shape-L2C128": "2 blocks, 3,630 steps (the steps 180 s buy)",
    "shape-L4C128": "4 blocks, 1,676 steps, learning rate 0.004",
    "ve": "value embeddings: a (V, C) table per block mixed into its attention values, "
          "v = a v + b ve[idx] (benchmarks/levers_model.py)",
    "unet": "U-net skips: block i's output, times a learned scalar, added to block L-1-i's "
            "input (3 blocks: block 0's into block 2)",
    "ve+unet": "value embeddings and U-net skips together",
}


def summarise_levers(rows: list[dict], base: str = "base") -> list[dict]:
    """Each tag's selection-split runs against the ``base`` tag's of the same CPU, paired by seed
    (the same initial weights and batches): its mean selection loss and, over the seeds both
    ran, the mean, lowest and highest change ``lever - base`` (negative: the lever helps); the
    validation split's change beside it, for the record only (nothing is chosen on it).

    Runs are compared only within one CPU (a row's ``"cpu"``, its model name and bfloat16 flags;
    the oldest rows hold the name only): where bfloat16 is
    native, Muon's Newton-Schulz runs in it (``tinygpt.muon.fast_ns_dtype``), elsewhere in
    float32, so the same seed trains another model on another CPU. For each CPU, its base
    first, then its levers from the most helpful change to the least."""
    selection = [r for r in rows if r.get("split") == "selection"]
    groups: dict[tuple[str, str], dict[int, dict]] = {}
    for r in selection:
        groups.setdefault((r.get("cpu", UNNAMED_CPU), r["tag"]), {})[r["seed"]] = r
    out = []
    for (cpu, tag), runs in groups.items():
        if (cpu, base) not in groups:
            raise ValueError(f"no run on {cpu} is tagged {base!r}: nothing there to compare "
                             f"{tag!r} with")
        bases = groups[(cpu, base)]
        paired = sorted(set(runs) & set(bases))
        change = [runs[s]["selection_loss"] - bases[s]["selection_loss"] for s in paired]
        val = [runs[s]["whole_val_loss"] - bases[s]["whole_val_loss"] for s in paired]
        first = next(iter(runs.values()))
        out.append({
            "cpu": cpu, "tag": tag, "lever": LEVERS.get(tag, tag), "seeds": sorted(runs),
            "name": first["name"], "lr": first["lr"], "steps": first["steps"],
            "model_changes": first.get("model_changes", {}),
            "train_changes": first.get("train_changes", {}),
            "model_levers": first.get("model_levers", {}),
            "selection_loss": statistics.mean(r["selection_loss"] for r in runs.values()),
            "base_spread": (max(r["selection_loss"] for r in bases.values())
                            - min(r["selection_loss"] for r in bases.values())),
            "paired_seeds": paired,
            "change": statistics.mean(change) if change else None,
            "change_low": min(change, default=None), "change_high": max(change, default=None),
            "val_change": statistics.mean(val) if val else None})
    cpus = list(dict.fromkeys(row["cpu"] for row in out))  # in the order the runs came
    return sorted(out, key=lambda row: (cpus.index(row["cpu"]), row["tag"] != base,
                                        row["change"] is None, row["change"] or 0.0))


def write_levers(args: argparse.Namespace) -> None:
    """The levers' record (``LEVERS_RESULT``) from the JSONL files of ``--summarise``."""
    rows = [json.loads(line) for path in args.summarise
            for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    table = summarise_levers(rows)
    for row in table:
        change = ("" if row["change"] is None or row["tag"] == "base" else
                  f" change {row['change']:+.4f} [{row['change_low']:+.4f}, "
                  f"{row['change_high']:+.4f}]")
        print(f"{row['cpu']}: {row['tag']:>16s} seeds {len(row['seeds'])} selection "
              f"{row['selection_loss']:.4f}{change}")
    Path(args.levers_out).write_text(json.dumps({
        "command": "python " + " ".join(sys.argv), "machine": machine(), "note": args.note,
        "levers": table, "runs": rows}, indent=1) + "\n")


GPU_SHAPE = (6, 384, 6, 256, 64)  # nanoGPT's shakespeare-char size, for --gpu-scale


def gpu_scale(args: argparse.Namespace) -> None:
    """The book's recipe (GPT-2's parts, AdamW) and the modern one (chapter 12's changes, Muon)
    at a GPU's scale (``GPU_SHAPE``), the same steps each, bf16 autocast: curves, whole-split
    loss, tokens/s and 400 characters from the book's prompt and sample seed."""
    from tinygpt.sample import generate
    from tinygpt.tokenizer import CharTokenizer  # noqa: F401  (the type book_data returns)

    tok, train_ids, val_ids = book_data()
    n_layer, n_embd, n_head, block, batch = GPU_SHAPE
    rows = []
    for label, lr, modern in (("GPT-2's parts, AdamW", args.gpu_lr_book, False),
                              ("modern, Muon", args.gpu_lr_modern, True)):
        model_cfg = replace(BOOK_RECIPE.model, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                            block_size=block, **(MODERN_PARTS if modern else {}))
        cfg = replace(BOOK_RECIPE.train, batch_size=batch, max_iters=args.gpu_steps,
                      learning_rate=lr, min_lr=0.0, warmup_iters=200, device=args.device,
                      dtype="bfloat16", optimizer="muon" if modern else "adamw",
                      eval_interval=max(args.gpu_steps // 10, 1), eval_iters=20)
        torch.manual_seed(cfg.seed)
        model = GPT(model_cfg)
        start = time.perf_counter()
        history = train(model_cfg, cfg, train_ids, val_ids, model=model, progress=False)
        seconds = time.perf_counter() - start
        whole = score(model, val_ids, block)
        prompt = torch.tensor([tok.encode(BOOK_RECIPE.prompt)], device=model.lm_head.weight.device)
        out = generate(model, prompt, BOOK_RECIPE.sample_chars,
                       temperature=BOOK_RECIPE.temperature,
                       generator=torch.Generator(prompt.device).manual_seed(BOOK_RECIPE.sample_seed))
        speeds = [r["tokens_per_s"] for r in history if "tokens_per_s" in r]
        rows.append({"name": label, "model": asdict(model_cfg), "train": asdict(cfg),
                     "whole_val_loss": whole, "train_s": seconds,
                     "median_tokens_per_s": statistics.median(speeds),
                     "parameters": sum(p.numel() for p in model.parameters()),
                     "curve": [[r["step"], round(r["val_loss"], 4), round(r["train_loss"], 4)]
                               for r in history if "val_loss" in r],
                     "sample": tok.decode(out[0, prompt.shape[1]:].tolist())})
        print(f"{label}: {whole:.4f} after {args.gpu_steps} steps, {seconds:.0f} s", flush=True)
        print(rows[-1]["sample"][:300], flush=True)
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else machine()
    Path(args.gpu_out).write_text(json.dumps({"command": "python " + " ".join(sys.argv),
                                              "device": device_name, "torch": torch.__version__,
                                              "rows": rows}, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--time", action="store_true")
    p.add_argument("--train", action="store_true")
    p.add_argument("--timings", default="benchmarks/results/modern_book_timings.json")
    p.add_argument("--timing-steps", type=int, default=25)
    p.add_argument("--budget-s", type=float, default=180.0)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--device", default="cpu")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--shapes", nargs="*")
    p.add_argument("--lrs", nargs="*", type=float)
    p.add_argument("--out", default="modern_book_sweep.jsonl")
    p.add_argument("--variants", help="a JSON list of runs instead of the grid: each with name "
                   "(a timed shape), lr, and optionally seed, model_changes, train_changes, "
                   "model_levers (LeverGPT's: value_embeddings, unet_skips)")
    p.add_argument("--cpu-seeds", nargs="*", type=int, help="train MODERN_RECIPE with these "
                   f"seeds on this machine and write {SEEDS_RESULT.name}")
    p.add_argument("--gpu-scale", action="store_true")
    p.add_argument("--gpu-steps", type=int, default=3000)
    p.add_argument("--gpu-lr-book", type=float, default=1e-3)
    p.add_argument("--gpu-lr-modern", type=float, default=2e-3)
    p.add_argument("--gpu-out", default="modern_book_gpu.json")
    p.add_argument("--summarise", nargs="*", help="JSONL files of --train sweeps with the "
                   f"selection split: write their levers' record ({LEVERS_RESULT.name})")
    p.add_argument("--levers-out", default=str(LEVERS_RESULT))
    p.add_argument("--note", default="", help="--summarise: a note kept in the record")
    args = p.parse_args()
    if args.summarise:
        write_levers(args)
        return
    if not (args.time or args.train or args.cpu_seeds or args.gpu_scale):  # e.g. `make bench`
        print(__doc__.split("Usage:")[1].strip())
        return
    if args.cpu_seeds:
        cpu_seeds(args)
    if args.gpu_scale:
        gpu_scale(args)
    if args.time:
        time_shapes(args)
    if args.train:
        train_candidates(args)


if __name__ == "__main__":
    main()
