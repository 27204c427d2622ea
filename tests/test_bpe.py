"""Tests of tinygpt.bpe: pre-splitting, pair counting, merging, and the two trainers.

References: GPT-2's pre-split is checked against HF tokenizers' ByteLevel pre-tokenizer,
GPT-4's pattern against the one shipped with tiktoken, and the fast trainer against the
textbook trainer (which is short enough to check by reading).
"""

from __future__ import annotations

import inspect
import random
import re
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
from conftest import require_data
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt import bpe
from tinygpt.bpe import (
    GPT2_PATTERN,
    GPT4_PATTERN,
    PATTERNS,
    encode_chunk,
    merge,
    pair_counts,
    split_text,
    train_merges,
    train_merges_naive,
)
from tinygpt.tokenizer import BPETokenizer

FAST = settings(max_examples=60, deadline=None)
# Text for comparisons with other libraries: code points unassigned in Python's Unicode
# tables (category Cn) are left out, since each library ships its own Unicode version
# and a character added later (e.g. U+3D000) is a letter to one and not to another.
ASSIGNED_TEXT = st.text(st.characters(exclude_categories=("Cn", "Cs")), max_size=200)


def data_file(name: str) -> Path:
    """Path of a data file, under the shared policy of conftest (skip locally, fail in CI)."""
    return require_data(name)


@pytest.fixture(scope="module")
def shakespeare() -> str:
    return data_file("tinyshakespeare").read_text(encoding="utf-8")


# ---------------------------------------------------------------- pre-splitting
def test_gpt4_pattern_is_tiktokens_cl100k():
    from tiktoken_ext import openai_public
    assert GPT4_PATTERN in inspect.getsource(openai_public)


@FAST
@given(ASSIGNED_TEXT)
def test_gpt2_split_matches_hf_byte_level(text):
    from tokenizers import pre_tokenizers
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    expected = [text[a:b] for _, (a, b) in pre.pre_tokenize_str(text)]
    assert split_text(text, "gpt2") == expected


@FAST
@given(st.text(max_size=200), st.sampled_from(["gpt2", "gpt4", "none", r"\w+|\W"]))
def test_split_covers_the_text(text, pattern):
    chunks = split_text(text, pattern)
    assert "".join(chunks) == text
    assert all(chunks)


def test_split_patterns_and_errors():
    assert PATTERNS == {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN, "none": None}
    assert split_text("hello world", None) == ["hello world"]
    assert split_text("", None) == []
    assert split_text("I'll go", "gpt2") == ["I", "'ll", " go"]
    assert split_text("12345", "gpt4") == ["123", "45"]  # GPT-4 caps numbers at 3 digits
    assert split_text("12345", "gpt2") == ["12345"]
    with pytest.raises(ValueError, match="regular expression"):
        split_text("abc", "([unclosed")
    with pytest.raises(TypeError, match="str"):
        split_text(b"abc", "gpt2")
    with pytest.raises(TypeError, match="pattern"):
        split_text("abc", 42)


# ---------------------------------------------------------------- pairs and merges
def test_pair_counts_overlapping_and_accumulating():
    assert pair_counts([1, 1, 1]) == {(1, 1): 2}
    counts = pair_counts([1, 2, 3])
    assert pair_counts([2, 3], counts) is counts
    assert counts == {(1, 2): 1, (2, 3): 2}
    assert pair_counts([]) == {} and pair_counts([5]) == {}


def expand(ids, pair, new_id):
    return [x for i in ids for x in (pair if i == new_id else (i,))]


@FAST
@given(st.lists(st.integers(0, 3), max_size=40), st.integers(0, 3), st.integers(0, 3))
def test_merge_properties(ids, a, b):
    out = merge(ids, (a, b), 99)
    assert expand(out, (a, b), 99) == ids  # merging only groups, never loses ids
    assert (a, b) not in set(pairwise(out))  # every occurrence was merged
    assert sum(pair_counts(ids).values()) == max(len(ids) - 1, 0)


def test_merge_is_left_to_right_and_non_overlapping():
    assert merge([7, 7, 7], (7, 7), 256) == [256, 7]
    assert merge([7, 7, 7, 7], (7, 7), 256) == [256, 256]


# ---------------------------------------------------------------- trainers
def test_trainers_agree_on_shakespeare(shakespeare):
    chunks = split_text(shakespeare[:30_000], "gpt2")
    naive = train_merges_naive([c.encode() for c in chunks], 60)
    assert len(naive) == 60
    assert train_merges(chunks, 60) == naive
    assert train_merges(Counter(chunks), 60) == naive


@FAST
@given(st.lists(st.text(max_size=12), max_size=25), st.integers(0, 40))
def test_trainers_agree_on_random_text(chunks, num_merges):
    naive = train_merges_naive(chunks, num_merges)
    assert train_merges(chunks, num_merges) == naive
    assert train_merges(Counter(chunks), num_merges) == naive


@FAST
@given(st.lists(st.lists(st.sampled_from([97, 98]), max_size=15), max_size=8),
       st.integers(0, 12))
def test_trainers_agree_on_repeated_bytes(chunks, num_merges):
    # few distinct bytes means many overlapping pairs like (a, a) and many ties
    assert train_merges(chunks, num_merges) == train_merges_naive(chunks, num_merges)


def test_overlapping_pairs_and_tie_breaking():
    merges = train_merges(["aaaaaa"], 5)
    assert merges == train_merges_naive(["aaaaaa"], 5)
    # 6 a's: (a,a) x5 -> [A,A,A]: (A,A) x2 -> [AA, A]: (AA, A) x1 -> one token, then stop
    assert merges == [(97, 97), (256, 256), (257, 256)]
    # every pair of "abcd" occurs once: the smallest pair wins the tie
    assert train_merges(["abcd", "dc"], 1) == train_merges_naive(["abcd", "dc"], 1) == [(97, 98)]


def test_weighted_counts_equal_repeated_chunks():
    assert train_merges(Counter({"xy": 3, "zw": 2}), 2) == [(120, 121), (122, 119)]
    repeated = ["xy"] * 3 + ["zw"] * 2
    assert train_merges(repeated, 2) == train_merges_naive(repeated, 2)


def test_trainers_stop_early_and_validate():
    assert train_merges(["ab"], 10) == train_merges_naive(["ab"], 10) == [(97, 98)]
    assert train_merges([], 10) == train_merges_naive([], 10) == []
    for trainer in (train_merges, train_merges_naive):
        with pytest.raises(ValueError, match="num_merges"):
            trainer(["ab"], -1)
        with pytest.raises(ValueError, match=re.escape("0..255")):
            trainer([[1, 300]], 1)
    with pytest.raises(ValueError, match="counts"):
        train_merges({"ab": -2}, 1)


def test_progress_bar_does_not_change_result(capsys):
    assert train_merges(["hello", "help"], 3, progress=True) == train_merges(["hello", "help"], 3)


# ---------------------------------------------------------------- encoding a chunk
def _toy_ranks(merges):
    tokens = [bytes([b]) for b in range(256)]
    for a, b in merges:
        tokens.append(tokens[a] + tokens[b])
    ranks = {}
    for i, t in enumerate(tokens):
        ranks.setdefault(t, i)
    return ranks


@FAST
@given(st.binary(max_size=300), st.binary(min_size=1, max_size=300))
def test_long_chunk_algorithm_matches_short_one(training, piece):
    ranks = _toy_ranks(train_merges([piece, training], 40))
    by_rank = {r: t for t, r in ranks.items()}
    long = bpe._encode_long_chunk(piece, ranks)
    assert b"".join(by_rank[i] for i in long) == piece
    if piece not in ranks:  # else encode_chunk answers at once with the whole piece
        assert long == encode_chunk(piece, ranks)


def test_dna_like_text_without_spaces_trains_the_same_merges_as_naive():
    """The fast trainer touches only a merge's occurrences; one endless chunk (no pre-split
    boundary) must still give the textbook's merges, overlapping runs included."""
    rng = random.Random(0)
    dna = "".join(rng.choices("ACGT", k=3000))
    chunks = [dna, "A" * 500, dna[:700]]
    assert train_merges(chunks, 60) == train_merges_naive(chunks, 60)
    assert BPETokenizer.train(dna, 300).decode(BPETokenizer.train(dna, 300).encode(dna)) == dna
