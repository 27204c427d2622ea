"""Issue #35 item 10: text without spaces (one character repeated, DNA, base64) must not make
``prepare``'s memory grow with the longest run. Runs longer than ``tinygpt.stream.LONGEST_RUN``
are cut every that many characters (as Llama 3's tokenizer does) in training, encoding, streaming
and prepare's parts alike; ordinary text is unaffected (the tiktoken and Hugging Face comparisons
in test_tokenizer.py and test_stream.py still hold). The bound is made small here so that the
cuts happen in small texts; the benchmark (benchmarks/prepare_limits.py) measures the memory."""

from __future__ import annotations

import random

import pytest

import tinygpt.stream as stream
from tinygpt.bpe import split_text
from tinygpt.prepare import documents
from tinygpt.prepare.documents import Options, parts
from tinygpt.prepare.workers import count_words
from tinygpt.tokenizer import BPETokenizer

BOUND = 7
PIECES = ["a", "aaaa", "b", " ", "   ", "\n", "\n\n  ", ",", ",,,", "1", "é", "'s", " x", "\t\t"]


@pytest.fixture
def small_bound(monkeypatch):
    monkeypatch.setattr(stream, "LONGEST_RUN", BOUND, raising=False)  # raising: the old code


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def tokenizer(request) -> BPETokenizer:
    training = "aaaa bbbb aaaa, cc!\n\n  " * 30 + "a" * 40 + " " * 30
    return BPETokenizer.train(training, 300, pattern=request.param)


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 40)))


def test_no_chunk_or_word_of_an_unbroken_text_exceeds_the_bound(small_bound):
    text = "a" * 1000
    assert max(map(len, split_text(text, "gpt4"))) == BOUND  # was one chunk of 1,000
    assert max(map(len, split_text(text, "gpt2"))) == BOUND
    assert max(map(len, split_text(" " * 1000, "gpt4"))) <= BOUND
    assert max(map(len, split_text(text, None))) == BOUND
    words = count_words([text, "x" + "," * 500])
    assert max(map(len, words)) <= 2 * BOUND + 1
    assert sum(len(w) * n for w, n in words.items()) == 1000 + 501


def test_prepare_reads_an_unbroken_document_in_bounded_parts(small_bound, monkeypatch, tmp_path):
    monkeypatch.setattr(documents, "READ_CHARS", 100)
    (tmp_path / "doc.txt").write_text("ab" * 5000)
    import regex

    from tinygpt.bpe import GPT4_PATTERN

    found = list(parts([("doc.txt", tmp_path / "doc.txt")], regex.compile(GPT4_PATTERN).findall,
                       Options(), part_chars=300))
    assert "".join(text for _, text, _ in found) == "ab" * 5000
    assert max(len(text) for _, text, _ in found) <= 300 + 100 + BOUND  # was one part of 10,000


def test_an_unbroken_text_is_encoded_in_pieces_of_the_bound(small_bound, tokenizer, monkeypatch):
    longest = []
    encode = tokenizer._encode_chunks

    def spy(text):
        longest.append(len(text))
        return encode(text)

    monkeypatch.setattr(tokenizer, "_encode_chunks", spy)
    if tokenizer._words is not None:
        monkeypatch.setattr(tokenizer._words, "encode_text", spy)
        tokenizer._words.clear()
    ids = tokenizer.encode_ordinary("a" * 1000)
    assert tokenizer.decode(ids) == "a" * 1000
    assert max(longest) <= 2 * BOUND + 1  # was the whole 1,000


def test_encoding_cut_runs_is_the_same_whole_streamed_or_in_prepare_parts(small_bound, tokenizer,
                                                                        monkeypatch):
    monkeypatch.setattr(stream, "MIN_CHARS", 1)  # look for a cut after every part
    rng = random.Random(0)
    for _ in range(300):
        text = random_text(rng)
        whole = tokenizer.encode_ordinary(text)
        expected = [i for piece in stream.run_pieces(text)
                    for i in tokenizer.encode_ordinary(piece)]
        assert whole == expected
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 8))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert list(tokenizer.encode_iterable(pieces)) == whole
        for end in range(len(text) + 1):  # a settled cut of any prefix is settled in the whole
            cut = stream.settled_cut(text[:end], tokenizer.pre_split)
            assert (tokenizer.encode_ordinary(text[:cut])
                    + tokenizer.encode_ordinary(text[cut:])) == whole, (text, end, cut)


def test_ordinary_text_is_not_cut():
    text = "First Citizen: Before we proceed any further, hear me speak.\n" * 2000
    assert stream.run_cuts(text) == []
    assert stream.run_cuts("a" * stream.LONGEST_RUN) == []
    assert stream.run_cuts("a" * (stream.LONGEST_RUN + 1)) == [stream.LONGEST_RUN]


def naive_run_cuts(text: str, limit: int) -> list[int]:
    """Llama 3's ``_split_whitespaces_or_nonwhitespaces``, with the patterns' ``\\s``."""
    import regex

    space = [regex.match(r"\s", c) is not None for c in text]
    cuts, length = [], 0
    for i in range(len(text)):
        same = i > 0 and space[i] == space[i - 1]
        length = length + 1 if same else 1
        if length > limit:
            cuts.append(i)
            length = 1
    return cuts


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 7, 10])
def test_run_cuts_are_llama_3s_cuts(monkeypatch, limit):
    monkeypatch.setattr(stream, "LONGEST_RUN", limit, raising=False)
    rng = random.Random(limit)
    for _ in range(400):
        text = random_text(rng) + "".join(rng.choice("a \n\x1c") * rng.randint(0, 30)
                                          for _ in range(rng.randint(0, 3)))
        assert stream.run_cuts(text) == naive_run_cuts(text, limit), text
