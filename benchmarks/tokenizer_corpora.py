"""Our tokenizers against tiktoken and Hugging Face ``tokenizers`` on two corpora of a gigabyte.

The corpora: ``repeated``, the plays' speeches shuffled and repeated (``prepare.py``'s corpus,
about 200 copies of the same words), and ``ngram``, text drawn from the plays' character n-gram
model (``ngram_corpus.py``), whose sentences do not repeat and whose vocabulary keeps growing.
On each, in fresh processes, with ``--workers`` worker processes (ours) or threads (theirs):

* encoding with GPT-2's tokenizer: ``write_shards`` (reading the files, encoding, writing the
  shards) against tiktoken's ``encode_ordinary_batch`` (its encoding calls only; the documents are
  read in batches of about 64 MB beforehand), tokens per second (the counts must agree);
* learning a BPE vocabulary of 10,000 tokens with ``<|endoftext|>`` on the training documents:
  ``prepare``'s tokenizer step against ``BpeTrainer`` fed the same documents, seconds (and the
  tokens per byte each vocabulary gives held-out text, to show they learned alike);
* the peak resident memory of each process (ours: the main process and its largest worker).

The load of the machine (``os.getloadavg``) is recorded before each measurement.

Usage: nice -n 10 python benchmarks/tokenizer_corpora.py [--size 1000] [--workers 2]
       [--tmp DIR] [--out benchmarks/results/tokenizer_corpora.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ngram_corpus
import prepare
from _machine import cpu_model


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def script(name: str, *argv: str) -> dict:
    """Run ``benchmarks/NAME`` with ``argv`` in a fresh process; the JSON it printed last."""
    run = subprocess.run([sys.executable, str(Path(__file__).resolve().parent / name), *argv],
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def compare(corpus: Path, scratch: Path, workers: int) -> dict:
    """The four measurements on ``corpus``, each in a fresh process, shards in ``scratch``."""
    entry: dict = {"loads": {}}
    runs = {"bpe": ("bpe", str(workers)), "hf_bpe": ("hf-bpe",),
            "encode": ("prepare", str(workers)), "tiktoken": ("tiktoken", str(workers))}
    for name, (kind, *extra) in runs.items():
        shards = scratch / f"shards-{name}"
        entry["loads"][name] = load()
        start = time.perf_counter()
        entry[name] = prepare.measure(kind, corpus, shards, *extra,
                                      threads=workers if kind == "hf-bpe" else 0)
        entry[name]["wall_seconds"] = time.perf_counter() - start
        shutil.rmtree(shards, ignore_errors=True)
        print(name, json.dumps(entry[name]), flush=True)
    for name in ("encode", "tiktoken"):
        entry[name]["tokens_per_s"] = entry[name]["tokens"] / entry[name]["seconds"]
    if entry["encode"]["tokens"] != entry["tiktoken"]["tokens"]:
        raise AssertionError(f"token counts differ: {entry['encode']['tokens']} (ours) and "
                             f"{entry['tiktoken']['tokens']} (tiktoken)")
    entry["encode_vs_tiktoken"] = (entry["encode"]["tokens_per_s"]
                                   / entry["tiktoken"]["tokens_per_s"])
    entry["bpe_vs_hf_time"] = entry["bpe"]["seconds"] / entry["hf_bpe"]["seconds"]
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=float, default=1000, help="MB per corpus (default 1000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tmp", default=None, help="folder for the repeated corpus and shards")
    parser.add_argument("--corpora", default="repeated,ngram")
    parser.add_argument("--out", default="benchmarks/results/tokenizer_corpora.json")
    args = parser.parse_args()
    results: dict = {"command": "python " + " ".join(sys.argv),
                     "machine": f"{cpu_model()[0]}, {platform.machine()}, {os.cpu_count()} CPU "
                                f"cores, Python {platform.python_version()}",
                     "load_at_start": load(), "workers": args.workers,
                     "bpe_vocab_size": prepare.BPE_VOCAB, "corpora": {}}
    with tempfile.TemporaryDirectory(prefix="tinygpt-corpora-", dir=args.tmp) as tmp:
        for name in args.corpora.split(","):
            # built and measured in fresh processes, so that this one stays small: a process
            # started from it begins with its peak resident memory (see prepare.peak_rss_mib)
            start = time.perf_counter()
            if name == "repeated":
                folder = Path(tmp) / "repeated"
                size = prepare.make_corpus(folder, args.size)
                how = "prepare.make_corpus: the plays' speeches shuffled (seed 0) and repeated"
                stats = script("ngram_corpus.py", "--stats-of", str(folder))["repetition"]
            elif name == "ngram":
                folder = ngram_corpus.default_folder(args.size)
                if folder.exists():
                    shutil.rmtree(folder)  # built again, so that its time is measured
                built = script("ngram_corpus.py", "--size", str(args.size), "--out", str(folder))
                size, stats = built["bytes"], built["repetition"]
                how = ("ngram_corpus.build: chains of the plays' character 6-gram model "
                       "(seed 0), 16,384-character documents")
            else:
                raise ValueError(f"unknown corpus {name!r}: repeated or ngram")
            entry = {"how": how, "bytes": size, "folder": str(folder),
                     "build_and_stats_seconds": time.perf_counter() - start,
                     "repetition": stats}
            print(name, json.dumps(entry), flush=True)
            entry.update(compare(folder, Path(tmp), args.workers))
            results["corpora"][name] = entry
            if name == "repeated":
                shutil.rmtree(folder)
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")  # after each corpus
    results["load_at_end"] = load()
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
