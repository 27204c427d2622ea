"""benchmarks/ngram_corpus.py: the n-gram benchmark corpus is deterministic and does not repeat."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import ngram_corpus

from tinygpt.data import load_text
from tinygpt.tokenizer import EOT


def small(folder: Path, seed: int = 0) -> int:
    return ngram_corpus.build(folder, 0.3, seed=seed, doc_chars=3000, chains=40,
                              docs_per_file=16)


def test_the_corpus_is_deterministic_and_seeded(tmp_path) -> None:
    sizes = [small(tmp_path / name, seed) for name, seed in (("a", 0), ("b", 0), ("c", 1))]
    files = {name: sorted((tmp_path / name).iterdir()) for name in "abc"}
    assert sizes[0] == sizes[1] == sizes[2] == sum(p.stat().st_size for p in files["a"])
    assert [p.read_bytes() for p in files["a"]] == [p.read_bytes() for p in files["b"]]
    assert [p.read_bytes() for p in files["a"]] != [p.read_bytes() for p in files["c"]]
    docs = [d for p in files["a"] for d in p.read_text().split(EOT)]
    assert len(docs) == 100 and all(len(d) == 3000 for d in docs)  # 0.3 MB of 3,000 chars
    speakers = {line for line in load_text("shakespeare").splitlines() if line.endswith(":")}
    assert sum(d.split("\n", 1)[0] in speakers for d in docs) >= 70  # mostly a speaker first


def test_repetition_counts_repeated_windows(tmp_path) -> None:
    """A text of 100 made-up words three times over: 100 distinct 8-word windows of 293."""
    folder = tmp_path / "repeated"
    folder.mkdir()
    words = [f"zq{i}x" for i in range(100)]
    (folder / "part0000.txt").write_text(" ".join(words * 3))
    stats = ngram_corpus.repetition(folder)
    assert stats["words"] == 300 and stats["distinct_words"] == 100
    assert stats["windows"] == 293
    assert stats["distinct_window_fraction"] == pytest.approx(100 / 293)
    assert stats["words_not_in_plays"] == 1.0


def test_the_ngram_corpus_does_not_repeat_where_the_plays_twice_do(tmp_path) -> None:
    small(tmp_path / "ngram")
    drawn = ngram_corpus.repetition(tmp_path / "ngram")
    assert drawn["distinct_window_fraction"] > 0.999
    assert 0.01 < drawn["words_not_in_plays"] < 0.1  # mostly the plays' words, some new
    twice = tmp_path / "twice"
    twice.mkdir()
    (twice / "part0000.txt").write_text(load_text("shakespeare")[:150_000] * 2)
    copied = ngram_corpus.repetition(twice)
    assert copied["distinct_window_fraction"] == pytest.approx(0.5, abs=0.01)
    assert copied["words_not_in_plays"] == 0.0
