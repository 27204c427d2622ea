"""A benchmark corpus whose text does not repeat: characters drawn from chapter 2's n-gram model.

``benchmarks/prepare.py`` builds its gigabyte by shuffling the plays' speeches again and again:
about 200 copies of the same words, the best case for an encoder that remembers the pieces it has
split. This corpus is drawn instead from the plays' character n-gram model
(:class:`tinygpt.ngram.NGramModel`, ``n = 6`` by default, no smoothing): each document is one
chain started at the first ``n - 1`` characters of a speech chosen at random, so it has the plays'
look (speakers' names, lines of verse) and mostly their words, but its sentences are new and a
few percent of its words were never in the plays, and more of them turn up the more text is
drawn, as in a real corpus. Many chains are drawn side by side (``NGramModel.sample_chains``),
about 20 M characters a second on one core here.

What makes the claim measurable, :func:`repetition`: the fraction of distinct 8-word windows
(words split at whitespace) in a corpus, its distinct words, and the share of its words that
the plays do not have; the repeated corpus, for comparison, has fewer distinct windows the more
copies it holds.

Deterministic: the same ``seed``, ``n`` and sizes give the same bytes (each block of chains has
its own seeded generator). Files of ``docs_per_file`` documents separated by ``<|endoftext|>``,
as ``prepare.py``'s corpus.

Usage: python benchmarks/ngram_corpus.py [--size 1000] [--out FOLDER] [--stats-mb MB]
       python benchmarks/ngram_corpus.py --stats-of FOLDER [--stats-mb MB]
(default folder: ``<tinygpt cache>/bench-corpora/ngram6-seed0-1000MB``; never in the repository).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tinygpt.data import cache_dir, load_text
from tinygpt.ngram import NGramModel
from tinygpt.tokenizer import EOT

STEPS_PER_CALL = 1024  # positions drawn per call of sample_chains: bounds its int64 output


def plays_model(n: int) -> tuple[NGramModel, np.ndarray, bytes, np.ndarray]:
    """The plays' character n-gram model (fitted on the text read as a circle, so that every
    context has a next character), the plays' ids, the byte of each id, and where speeches
    start."""
    text = load_text("shakespeare")
    data = text.encode("ascii")  # the plays are ASCII: one byte a character
    codes = np.frombuffer(data, dtype=np.uint8)
    alphabet = np.unique(codes)  # (V,) the byte of each id
    lookup = np.zeros(256, dtype=np.int64)
    lookup[alphabet] = np.arange(len(alphabet))
    ids = lookup[codes]
    model = NGramModel(n, len(alphabet), smoothing=0.0).fit(np.concatenate([ids, ids[: n - 1]]))
    starts = np.flatnonzero((codes[:-n - 1] == 10) & (codes[1:-n] == 10)) + 2  # after "\n\n"
    return model, ids, alphabet.tobytes(), starts


def documents(megabytes: float, n: int = 6, seed: int = 0, doc_chars: int = 16384,
              chains: int = 16384) -> Iterator[bytes]:
    """The corpus's documents, in order, ``doc_chars`` bytes each, until ``megabytes`` MB.
    Blocks of ``chains`` documents are drawn side by side, block ``b`` from its own generator
    (seeded with ``(seed, b)``)."""
    if not (megabytes > 0 and n >= 1 and doc_chars >= n and chains >= 1):
        raise ValueError(f"need megabytes > 0, n >= 1, doc_chars >= n, chains >= 1; got "
                         f"{megabytes}, {n}, {doc_chars}, {chains}")
    model, ids, alphabet, starts = plays_model(n)
    to_byte = np.frombuffer(alphabet, dtype=np.uint8)
    remaining, block = int(megabytes * 1e6), 0
    while remaining > 0:
        count = min(chains, -(-remaining // doc_chars))  # documents in this block
        rng = np.random.default_rng([seed, block])
        begin = rng.choice(starts, size=count)  # (count,) a speech start for each chain
        out = np.empty((count, doc_chars), dtype=np.uint8)  # (count, doc_chars) the bytes
        prompt = ids[begin[:, None] + np.arange(n - 1)]  # (count, n - 1)
        out[:, : n - 1] = to_byte[prompt]
        for at in range(n - 1, doc_chars, STEPS_PER_CALL):
            steps = min(STEPS_PER_CALL, doc_chars - at)
            drawn = model.sample_chains(prompt, steps, rng)  # (count, steps)
            out[:, at : at + steps] = to_byte[drawn]
            prompt = np.concatenate([prompt, drawn], axis=1)[:, drawn.shape[1]:]
        for row in out:
            yield row.tobytes()[:remaining]
            remaining -= doc_chars
            if remaining <= 0:
                return
        block += 1


def build(folder: Path, megabytes: float, n: int = 6, seed: int = 0, docs_per_file: int = 256,
          **kwargs) -> int:
    """Write the corpus into ``folder`` (files ``part0000.txt``...); its bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    written, batch, index = 0, [], 0
    for doc in documents(megabytes, n, seed, **kwargs):
        batch.append(doc)
        if len(batch) == docs_per_file:
            written += write_file(folder / f"part{index:04d}.txt", batch)
            batch, index = [], index + 1
    if batch:
        written += write_file(folder / f"part{index:04d}.txt", batch)
    return written


def write_file(path: Path, docs: list[bytes]) -> int:
    data = EOT.encode().join(docs)
    path.write_bytes(data)
    return len(data)


def repetition(folder: Path, megabytes: float | None = None, window: int = 8) -> dict:
    """How much the corpus in ``folder`` (its files in name order, the first ``megabytes`` MB
    if given, whole files) repeats itself: the fraction of its ``window``-word windows (within
    each file) that are distinct, its words and distinct words, and the share of its words that
    are not words of the plays (words: split at whitespace, ``<|endoftext|>`` removed)."""
    limit = int(megabytes * 1e6) if megabytes else None
    plays = set(load_text("shakespeare").encode().split())
    index: dict[bytes, int] = {}
    hashes, size, words, new = [], 0, 0, 0
    for path in sorted(folder.iterdir()):
        if limit is not None and size >= limit:
            break
        data = path.read_bytes()
        size += len(data)
        tokens = data.replace(EOT.encode(), b"\n").split()
        ids = np.array([index.setdefault(w, len(index)) for w in tokens], dtype=np.uint64)
        words += len(tokens)
        new += sum(w not in plays for w in tokens)
        hashed = np.zeros(max(len(ids) - window + 1, 0), dtype=np.uint64)  # (windows,)
        with np.errstate(over="ignore"):  # a 64-bit polynomial hash of each window's word ids
            for j in range(window):
                hashed = hashed * np.uint64(0x9E3779B97F4A7C15) + ids[j : j + len(hashed)]
        hashes.append(hashed)
    every = np.concatenate(hashes)
    del hashes
    every.sort()
    distinct = int(len(every) > 0) + int((every[1:] != every[:-1]).sum())
    return {"megabytes": size / 1e6, "words": words, "distinct_words": len(index),
            "window": window, "windows": len(every),
            "distinct_window_fraction": distinct / max(len(every), 1),
            "words_not_in_plays": new / max(words, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=float, default=1000, help="MB (default 1000)")
    parser.add_argument("--n", type=int, default=6, help="the n-gram order (default 6)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="folder (default: in the tinygpt cache)")
    parser.add_argument("--stats-mb", type=float, default=None,
                        help="read only the first MB for the statistics (default: all)")
    parser.add_argument("--stats-of", default=None, help="only print the repetition statistics "
                        "of the corpus in this folder")
    args = parser.parse_args()
    if args.stats_of:
        print(json.dumps({"repetition": repetition(Path(args.stats_of), args.stats_mb)}))
        return
    folder = Path(args.out) if args.out else default_folder(args.size, args.n, args.seed)
    start = time.perf_counter()
    written = build(folder, args.size, args.n, args.seed)
    seconds = time.perf_counter() - start
    print(json.dumps({"folder": str(folder), "bytes": written, "seconds": seconds,
                      "repetition": repetition(folder, args.stats_mb)}))


def default_folder(megabytes: float, n: int = 6, seed: int = 0) -> Path:
    return cache_dir() / "bench-corpora" / f"ngram{n}-seed{seed}-{megabytes:g}MB"


if __name__ == "__main__":
    main()
