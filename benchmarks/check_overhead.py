"""Benchmark of the input checks' cost: a training step and a generated token of the book's model.

The checks are plain calls in the first lines of ``GPT.forward`` (the ids: shape, dtype and range,
one min and max of the ids), of each norm and attention layer (shapes only) and of each sampling
function (numbers and shapes only). What it measures, on the book's model
(``tinygpt.book.trained_model.BOOK_RECIPE``: 2 blocks, width 128, context 128, batch 16):

* the time of one training step (forward with targets, backward, AdamW), random ids;
* the time of one generated token (``generate``, cached, batch 1, ``--new`` tokens after a
  16-token prompt, temperature 0.8, top-k 10).

Two ways to compare:

* by default, in this process, the code as it is against the same code with every check
  replaced by a no-op (``GPT.check_inputs``, ``block.check_width``,
  ``attention.check_attention_input``, ``sample.check_sampling``): the checks' whole cost;
* ``--against TREE``: the same measurement (checks on) in two subprocesses, one importing
  ``TREE/src`` (say a checkout of main, whose checks ran through hooks and a global switch) and
  one this tree's ``src``: the change's cost as a whole.

Runs alternate between the two sides, ``--repeat`` times (median of each side; ratio = this
tree's time over the other's). Results depend on the machine and its load; the thread count is
printed. A record is written only with ``--out PATH``.

Usage: python benchmarks/check_overhead.py [--repeat 7] [--steps 20] [--new 100] [--threads 1]
       python benchmarks/check_overhead.py --against /path/to/main [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parents[1]


def _book_model() -> tuple[torch.nn.Module, object, object]:
    """The book's model (seeded), its train config and the GPT class, from whichever tree."""
    from tinygpt.book.trained_model import BOOK_RECIPE
    from tinygpt.model import GPT

    torch.manual_seed(0)
    return GPT(BOOK_RECIPE.model), BOOK_RECIPE.train, GPT


def step_time(steps: int) -> float:
    """Seconds per training step of the book's model, the mean over ``steps`` after a warm-up."""
    from tinygpt.train import configure_optimizer

    model, train_config, _ = _book_model()
    model.train()
    config = model.config
    optimizer = configure_optimizer(model, train_config)
    g = torch.Generator().manual_seed(1)
    B, T = train_config.batch_size, config.block_size
    x = torch.randint(config.vocab_size, (B, T), generator=g)  # (B, T)
    y = torch.randint(config.vocab_size, (B, T), generator=g)  # (B, T)

    def step() -> None:
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def token_time(new: int) -> float:
    """Seconds per generated token of the book's model (cached, batch 1), after a warm-up."""
    from tinygpt.sample import generate

    model, _, _ = _book_model()
    prompt = torch.randint(model.config.vocab_size, (1, 16), generator=torch.Generator()
                           .manual_seed(2))  # (1, 16)

    def run() -> None:
        generate(model, prompt, new, temperature=0.8, top_k=10,
                 generator=torch.Generator().manual_seed(3))

    run()
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) / new


@contextmanager
def checks_off() -> Iterator[None]:
    """Every check of the forward and sampling path replaced by a no-op, then put back."""
    import tinygpt.attention
    import tinygpt.block
    import tinygpt.model
    import tinygpt.sample

    def temperature_only(logits: object = None, temperature: object = 1.0, *args: object,
                         **kwargs: object) -> float:
        return float(temperature)  # type: ignore[arg-type]  # what check_sampling returns

    def nothing(*args: object, **kwargs: object) -> None:
        return None

    patches: list[tuple[object, str, Callable[..., object]]] = [
        (tinygpt.model.GPT, "check_inputs", nothing),
        (tinygpt.block, "check_width", nothing),
        (tinygpt.attention, "check_attention_input", nothing),
        (tinygpt.sample, "check_sampling", temperature_only),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, replacement in patches:
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, real in saved:
            setattr(owner, name, real)


def measure(steps: int, new: int, off: bool) -> dict[str, float]:
    """One measurement of both times, with the checks on (or, ``off``, replaced by no-ops)."""
    if not off:
        return {"step_s": step_time(steps), "token_s": token_time(new)}
    with checks_off():
        return {"step_s": step_time(steps), "token_s": token_time(new)}


def in_subprocess(tree: Path, steps: int, new: int, threads: int) -> dict[str, float]:
    """``measure`` (checks on) in a fresh Python that imports ``tree/src``."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    command = [sys.executable, __file__, "--worker", "--steps", str(steps), "--new", str(new),
               "--threads", str(threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="alternating runs per side")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run")
    parser.add_argument("--new", type=int, default=100, help="generated tokens per run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--against", type=Path, help="another tree (its src/) to compare with")
    parser.add_argument("--out", type=Path, help="write the record here (JSON)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(measure(args.steps, args.new, off=False)))
        return
    if args.against is not None:
        labels = (f"other tree ({args.against})", f"this tree ({HERE})")
        sides: list[Callable[[], dict[str, float]]] = [
            lambda: in_subprocess(args.against, args.steps, args.new, args.threads),
            lambda: in_subprocess(HERE, args.steps, args.new, args.threads)]
    else:
        labels = ("checks replaced by no-ops", "checks on (the code as it is)")
        sides = [lambda: measure(args.steps, args.new, off=True),
                 lambda: measure(args.steps, args.new, off=False)]
    load_before = round(os.getloadavg()[0], 2)
    runs: list[list[dict[str, float]]] = [[], []]
    for _ in range(args.repeat):
        for i, side in enumerate(sides):  # alternate, so that drift hits both sides alike
            runs[i].append(side())
    medians = [{key: statistics.median(r[key] for r in side_runs) for key in side_runs[0]}
               for side_runs in runs]
    print(f"book model, {args.threads} thread(s), {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}; median of {args.repeat} alternating runs")
    for label, median in zip(labels, medians):
        print(f"  {label}: {median['step_s'] * 1e3:.2f} ms per training step, "
              f"{median['token_s'] * 1e3:.3f} ms per generated token")
    ratios = {key: medians[1][key] / medians[0][key] for key in medians[0]}
    print(f"  ratio (second / first): training step {ratios['step_s']:.3f}, "
          f"generated token {ratios['token_s']:.3f}")
    if args.out is not None:
        spread = [{key: [min(r[key] for r in side_runs), max(r[key] for r in side_runs)]
                   for key in side_runs[0]} for side_runs in runs]  # each side's fastest, slowest
        record = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
                  "labels": labels, "medians": medians, "ratios": ratios, "spread": spread,
                  "threads": args.threads, "repeat": args.repeat, "steps": args.steps,
                  "new": args.new, "torch": torch.__version__,
                  "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
                  "load_before": load_before, "load_after": round(os.getloadavg()[0], 2)}
        partial = args.out.with_name(args.out.name + ".partial")  # then renamed: never half a file
        partial.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        os.replace(partial, args.out)


if __name__ == "__main__":
    main()
