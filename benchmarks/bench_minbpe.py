"""Encoding speed beside minbpe (Karpathy's pure-Python BPE): tinygpt's ``BPETokenizer`` and
minbpe's ``RegexTokenizer`` encode the same text with the same merges, and give the same ids.

Both tokenizers get the merges tinygpt learns on the corpus (``--vocab-size``) and GPT-4's
pre-split pattern as tinygpt spells it, so they do the same work; the ids are checked equal.
Each repeat times, one after the other so that they see the same machine load: minbpe's
``encode_ordinary``; tinygpt's ``encode_ordinary`` on a new tokenizer (*cold*: its caches of
words and pieces empty, the figure a text met once gets); and the same text again (*warm*:
every piece cached, what a large corpus whose words repeat approaches). Reported: tokens per
second and minbpe's time over tinygpt's, per repeat, and their median and spread.

minbpe is not a dependency: pass a checkout (``git clone https://github.com/karpathy/minbpe``)
with ``--minbpe-dir`` or ``MINBPE_DIR``; without one the benchmark says so and does nothing.

Usage: python benchmarks/bench_minbpe.py --minbpe-dir PATH [--repeats 5] [--vocab-size 512]
       [--corpus PATH] [--record]
``--record`` writes benchmarks/results/minbpe.json (command, machine, load, every repeat).
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
from pathlib import Path

from tinygpt.data import get_path
from tinygpt.tokenizer import BPETokenizer

RESULT = Path(__file__).parent / "results" / "minbpe.json"


def load_minbpe(directory: Path):
    """minbpe's ``RegexTokenizer`` class, imported from a checkout."""
    if not (directory / "minbpe" / "regex.py").is_file():
        raise SystemExit(f"{directory} is not a minbpe checkout (no minbpe/regex.py); clone "
                         "https://github.com/karpathy/minbpe and pass its folder")
    sys.path.insert(0, str(directory))
    from minbpe import RegexTokenizer
    return RegexTokenizer


def seconds(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minbpe-dir", type=Path, default=os.environ.get("MINBPE_DIR"),
                   help="a checkout of minbpe (default: $MINBPE_DIR; without one: skipped)")
    p.add_argument("--corpus", type=Path, default=None, help="text file (tinyshakespeare)")
    p.add_argument("--vocab-size", type=int, default=512, help="vocabulary size (512)")
    p.add_argument("--repeats", type=int, default=5, help="repeats (5)")
    p.add_argument("--record", action="store_true", help=f"write {RESULT}")
    args = p.parse_args(argv)
    if args.minbpe_dir is None:  # make bench runs every benchmark without arguments
        print("skipped: no minbpe checkout (pass --minbpe-dir or set MINBPE_DIR)")
        return 0
    RegexTokenizer = load_minbpe(Path(args.minbpe_dir))
    corpus = args.corpus or get_path("tinyshakespeare.txt")
    text = corpus.read_text(encoding="utf-8")
    load_start = os.getloadavg()
    ours = BPETokenizer.train(text, args.vocab_size, pattern="gpt4")
    theirs = RegexTokenizer(pattern=ours.pattern)  # tinygpt's spelling of GPT-4's pattern
    theirs.merges = {tuple(pair): 256 + i for i, pair in enumerate(ours.merges)}
    theirs.vocab = dict(enumerate(ours.tokens))
    repeats = []
    for r in range(args.repeats):
        fresh = BPETokenizer(ours.tokens, ours.merges, "gpt4")  # empty caches
        t_minbpe, ids_minbpe = seconds(lambda: theirs.encode_ordinary(text))
        t_cold, ids_cold = seconds(lambda fresh=fresh: fresh.encode_ordinary(text))
        t_warm, ids_warm = seconds(lambda fresh=fresh: fresh.encode_ordinary(text))
        if not ids_minbpe == ids_cold == ids_warm:
            raise SystemExit("tinygpt and minbpe disagree on the ids: the comparison is void")
        n = len(ids_cold)
        row = {"tokens": n, "minbpe_tokens_per_s": round(n / t_minbpe),
               "cold_tokens_per_s": round(n / t_cold), "warm_tokens_per_s": round(n / t_warm),
               "cold_ratio": round(t_minbpe / t_cold, 2),
               "warm_ratio": round(t_minbpe / t_warm, 2)}
        repeats.append(row)
        print(f"repeat {r + 1}: minbpe {n / t_minbpe / 1e3:.0f} k tokens/s; tinygpt cold "
              f"{n / t_cold / 1e6:.2f} M ({row['cold_ratio']:.1f}x), warm {n / t_warm / 1e6:.2f} M "
              f"({row['warm_ratio']:.1f}x)")
    stats = {key: summary([row[key] for row in repeats])
             for key in ("minbpe_tokens_per_s", "cold_tokens_per_s", "warm_tokens_per_s",
                         "cold_ratio", "warm_ratio")}
    print(f"median of {args.repeats}: cold {stats['cold_ratio']['median']}x minbpe "
          f"({stats['cold_ratio']['min']}..{stats['cold_ratio']['max']}), warm "
          f"{stats['warm_ratio']['median']}x ({stats['warm_ratio']['min']}.."
          f"{stats['warm_ratio']['max']})")
    try:
        commit = subprocess.run(["git", "-C", str(args.minbpe_dir), "rev-parse", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    result = {"command": "python benchmarks/bench_minbpe.py " + " ".join(
                  "--minbpe-dir MINBPE" if a.startswith("--minbpe-dir=") else a
                  for a in (argv if argv is not None else sys.argv[1:])),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU "
                         f"cores, Python {platform.python_version()}",
              "load_start": [round(v, 2) for v in load_start],
              "load_end": [round(v, 2) for v in os.getloadavg()],
              "corpus": corpus.name, "characters": len(text), "vocab_size": args.vocab_size,
              "pattern": "gpt4", "minbpe_commit": commit, "repeats": repeats, "summary": stats}
    if args.record:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps(result, indent=1) + "\n")
        print(f"recorded in {RESULT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
