"""Benchmark of the two resource limits of ``tinygpt prepare`` that issue #35 found (items 10, 11).

* ``memory``: peak resident memory of ``write_shards`` (what ``tinygpt prepare`` runs, one worker,
  in a fresh process each time) on text that has no space at all, at ``--sizes`` MB: one
  character repeated (the default BPE tokenizer, vocabulary 512) and random letters and
  punctuation (GPT-2's tokenizer, with ``--gpt2``). Before the fix memory grew with the longest
  run without spaces (about 230 bytes a character); runs are now cut every
  ``tinygpt.stream.LONGEST_RUN`` characters, so the ratios across sizes should be near 1.
* ``shards``: seconds of ``write_shards`` (character tokenizer) with ``--shard-tokens`` small, at
  two corpus sizes whose shard counts differ ``--shard-ratio`` times: before the fix the progress
  file was rewritten whole for every shard (quadratic); the seconds per shard should now be about
  the same at both sizes.

The record is printed, and written to ``--out`` only when given (the committed one,
``benchmarks/results/prepare_limits.json``, holds a run before and after the fix); it holds the
command, the machine and its load. Ratios, not seconds, are what carry over between machines.

Usage: nice -n 10 python benchmarks/prepare_limits.py [--sizes 1 2 4] [--gpt2] [--shards 300]
       [--shard-ratio 8] [--skip-memory] [--skip-shards] [--out RESULT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import resource, sys, time
from tinygpt.prepare import write_shards
from tinygpt.prepare.documents import Options
kind, path, out, shard_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tokenizer = {"repeat": "bpe", "nospace": "gpt2", "shards": "char"}[kind]
start = time.perf_counter()
m = write_shards(path, out, Options(tokenizer=tokenizer, shard_tokens=shard_tokens), workers=1)
seconds = time.perf_counter() - start
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, seconds,
      sum(len(v) for v in m["shards"].values()))
"""


def make_input(path: Path, kind: str, megabytes: float) -> None:
    """Write the input in blocks of 1 MB: a child's ``ru_maxrss`` starts from this process's
    peak (Linux keeps it across ``fork`` and ``exec``), so this process must stay small."""
    n = int(megabytes * 1e6)
    if kind in ("repeat", "nospace"):
        rng = random.Random(0)
        alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,;:-'!?()"
        with open(path, "w", encoding="utf-8") as f:
            for start in range(0, n, 1 << 20):
                size = min(1 << 20, n - start)
                f.write("a" * size if kind == "repeat" else "".join(rng.choices(alphabet, k=size)))
    else:  # ordinary text for the shard count: sentences with spaces and line breaks
        rng = random.Random(0)
        words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and"]
        lines, size = [], 0
        while size < n:
            line = " ".join(rng.choices(words, k=12)) + ".\n"
            lines.append(line)
            size += len(line)
        text = "".join(lines)[:n]  # documents of 10,000 characters: both splits get some
        path.write_text("<|endoftext|>".join(text[i:i + 10_000]
                                             for i in range(0, len(text), 10_000)))


def small_documents(folder: Path) -> None:
    """A few small ordinary files next to the unbroken one: the validation split gets some."""
    for i in range(20):
        (folder / f"small{i:02d}.txt").write_text(f"a small document, number {i}.\n")


def run_child(kind: str, path: Path, shard_tokens: int) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run([sys.executable, "-c", CHILD, kind, str(path), f"{tmp}/out",
                                 str(shard_tokens)], capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"prepare failed on {kind} {path}:\n{result.stderr[-2000:]}")
    peak, seconds, shards = result.stdout.split()[-3:]
    return float(peak), float(seconds), int(shards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 2, 4])
    parser.add_argument("--gpt2", action="store_true", help="also random text, GPT-2's tokenizer")
    parser.add_argument("--shards", type=int, default=300, help="shards at the smaller size")
    parser.add_argument("--shard-ratio", type=int, default=8)
    parser.add_argument("--shard-tokens", type=int, default=1000)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-shards", action="store_true")
    parser.add_argument("--out", type=Path, help="write the record there too")
    args = parser.parse_args()
    import tinygpt.stream

    record: dict = {"command": "python " + " ".join(sys.argv),
                    "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                               f"Python {platform.python_version()}",
                    "load_before": round(os.getloadavg()[0], 2),
                    "longest_run": getattr(tinygpt.stream, "LONGEST_RUN", None),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_memory:
            record["memory"] = {}
            for kind in ["repeat"] + ["nospace"] * args.gpt2:
                rows = []
                for mb in args.sizes:
                    path = Path(tmp) / f"{kind}_{mb}"
                    path.mkdir()
                    make_input(path / "doc.txt", kind, mb)
                    small_documents(path)
                    peak, seconds, _ = run_child(kind, path, 100_000_000)
                    rows.append({"megabytes": mb, "peak_mb": round(peak, 1),
                                 "seconds": round(seconds, 2)})
                    print(f"memory {kind} {mb} MB: peak {peak:.0f} MB, {seconds:.1f} s",
                          flush=True)
                base = rows[0]["peak_mb"]
                for row in rows:
                    row["peak_ratio"] = round(row["peak_mb"] / base, 3)
                record["memory"][kind] = rows
        if not args.skip_shards:
            rows = []
            for count in (args.shards, args.shards * args.shard_ratio):
                path = Path(tmp) / f"shards_{count}"
                path.mkdir()
                # characters: tokens, plus about 11 % of the documents held out for validation
                make_input(path / "doc.txt", "shards", count * args.shard_tokens / 1e6)
                _, seconds, shards = run_child("shards", path, args.shard_tokens)
                rows.append({"shards": shards, "seconds": round(seconds, 2),
                             "ms_per_shard": round(1000 * seconds / shards, 2)})
                print(f"shards: {shards} in {seconds:.1f} s", flush=True)
            rows[1]["shard_ratio"] = round(rows[1]["shards"] / rows[0]["shards"], 2)
            rows[1]["time_ratio"] = round(rows[1]["seconds"] / rows[0]["seconds"], 2)
            record["shards"] = rows
    record["load_after"] = round(os.getloadavg()[0], 2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
