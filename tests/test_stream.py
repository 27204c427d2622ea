"""Tests for tinygpt.stream: ``BPETokenizer.encode_iterable`` gives the ids of the joined text,
however it is cut into parts, lazily, in memory that does not grow with the length of the stream;
and runs without spaces longer than ``LONGEST_RUN`` are cut the same way in training, encoding,
streaming and prepare's parts."""

from __future__ import annotations

import itertools
import random
import re
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinygpt.stream as stream
from tinygpt.bpe import encode_chunk, split_text
from tinygpt.prepare import documents
from tinygpt.prepare.documents import Options, parts
from tinygpt.prepare.workers import count_words
from tinygpt.stream import special_sets
from tinygpt.tokenizer import BPETokenizer

TRAINING = ("First Citizen: Before we proceed any further, hear me speak.\n\nAll: Speak, speak.\n"
            "It's 2024 and we've 1234567 reasons   to    go!?\r\n  \n\t") * 20
PIECES = ["a", "b", " ", "  ", "\n", "\r\n", "1", "23", "4567", "'s", "'", "!", "?!", " .", "\t",
          "é", "日本", " x", "Hello", "\n\n", "   \n", "ll", "LL", "ve", " 're"]


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def tokenizer(request) -> BPETokenizer:
    return BPETokenizer.train(TRAINING, 300, pattern=request.param)


def random_parts(rng: random.Random) -> tuple[str, list[str]]:
    text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 60)))
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 12))))
    return text, [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_encode_iterable_equals_encode_however_the_text_is_cut(tokenizer, monkeypatch):
    monkeypatch.setattr(stream, "MIN_CHARS", 1)  # look for a cut after every part
    rng = random.Random(0)
    naive_differs = 0
    for _ in range(400):
        text, parts = random_parts(rng)
        assert list(tokenizer.encode_iterable(parts)) == tokenizer.encode(text)
        naive = [i for part in parts for i in tokenizer.encode_ordinary(part)]
        naive_differs += naive != tokenizer.encode(text)
    assert naive_differs > 50  # encoding each part on its own would be wrong: the cuts matter


def test_encode_iterable_of_a_files_lines_equals_encode_of_the_file(tokenizer, tmp_path):
    path = tmp_path / "text.txt"
    text = TRAINING * 80  # longer than MIN_CHARS: several cuts at the default
    path.write_text(text, encoding="utf-8", newline="")
    assert len(text) > 2 * stream.MIN_CHARS
    with open(path, encoding="utf-8", newline="") as f:
        assert list(tokenizer.encode_iterable(f)) == tokenizer.encode(text)


def test_encode_iterable_is_lazy(tokenizer, monkeypatch):
    monkeypatch.setattr(stream, "MIN_CHARS", 100)
    consumed = []

    def lines():
        for i in itertools.count():
            consumed.append(i)
            yield "to be or not to be, that is the question\n"

    ids = tokenizer.encode_iterable(lines())  # an endless stream
    first = list(itertools.islice(ids, 20))
    assert first == tokenizer.encode("to be or not to be, that is the question\n" * 3)[:20]
    assert len(consumed) < 10


def test_bad_input_is_a_clear_error(tokenizer):
    with pytest.raises(TypeError, match="not one string"):
        tokenizer.encode_iterable("some text")
    with pytest.raises(TypeError, match="at item 1"):
        list(tokenizer.encode_iterable(["ok", b"bytes"]))
    whole = BPETokenizer.train(TRAINING, 260, pattern=None)
    with pytest.raises(ValueError, match="pattern None"):
        whole.encode_iterable(["a"])


def test_memory_does_not_grow_with_the_stream():
    """tracemalloc's peak while encoding a 10 MB stream stays that of a 1 MB one: the text is
    never held whole (nor the ids: they are counted as they come)."""
    tokenizer = BPETokenizer.train(TRAINING, 300, pattern="gpt2")
    words = sorted(set(TRAINING.split()))

    def lines(n_chars: int):
        rng, size = random.Random(0), 0
        while size < n_chars:
            line = " ".join(rng.choice(words) for _ in range(12)) + "\n"
            size += len(line)
            yield line

    peaks = {}
    for mb in (1, 10):
        tracemalloc.start()
        try:
            n = sum(1 for _ in tokenizer.encode_iterable(lines(mb << 20)))
            peaks[mb] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert n > (mb << 20) // 10  # the whole stream was encoded
    assert peaks[10] < 1.5 * peaks[1], peaks
    assert peaks[10] < (10 << 20) // 4, peaks  # far less than the text itself


SPECIALS = ["<|endoftext|>", "<|end|>", "<|endoftext|>!", "<|fim|>"]  # one holds another


@pytest.fixture(scope="module")
def with_specials() -> BPETokenizer:
    return BPETokenizer.train(TRAINING, 300, pattern="gpt4", special_tokens=SPECIALS)


def test_encode_iterable_gives_one_id_per_allowed_special_token(with_specials):
    text = "Speak, speak.<|endoftext|>All: hear me<|endoftext|>"
    ids = list(with_specials.encode_iterable([text], allowed_special={"<|endoftext|>"}))
    assert ids == with_specials.encode(text, allowed_special={"<|endoftext|>"})
    assert ids.count(with_specials.special_tokens["<|endoftext|>"]) == 2
    with pytest.raises(ValueError, match=re.escape("<|endoftext|>' at position 13, which is")):
        list(with_specials.encode_iterable(["Speak, speak.<|endof", "text|>"]))
    plain = list(with_specials.encode_iterable([text], disallowed_special=()))
    assert plain == with_specials.encode(text, disallowed_special=()) == \
        with_specials.encode_ordinary(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(st.sampled_from(PIECES + SPECIALS + ["<|", "|>", "<|end", "oftext|>"]),
                       max_size=40),
       cuts=st.lists(st.integers(0, 400), max_size=12),
       allowed=st.sampled_from(["all", (), {"<|endoftext|>"}, {"<|end|>", "<|fim|>"}]))
def test_encode_iterable_equals_encode_with_special_tokens_cut_anywhere(with_specials, pieces,
                                                                        cuts, allowed):
    text = "".join(pieces)
    cuts = sorted({min(c, len(text)) for c in cuts})
    parts = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stream, "MIN_CHARS", 1)  # look for a cut after every part
        for disallowed in ("all", ()):
            try:
                expected = with_specials.encode(text, allowed, disallowed)
            except ValueError as err:
                where = re.search(r"at position \d+, which is disallowed", str(err)).group()
                with pytest.raises(ValueError, match=where):  # the same place (the token named
                    list(with_specials.encode_iterable(parts, allowed, disallowed))  # may vary)
            else:
                assert list(with_specials.encode_iterable(parts, allowed, disallowed)) == expected


def cached(cache: stream.RecentItems, key: str, make) -> object:
    """How the encoders use a RecentItems: look up, else recall, else make and remember."""
    value = cache.get(key) or cache.recall(key)
    if value is None:
        value = make(key)
        cache.remember(key, value)
    return value


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.text(alphabet="abcdé日", min_size=1, max_size=6), max_size=80),
       kept=st.integers(1, 5), chars=st.integers(1, 12))
def test_recent_items_give_each_keys_value_in_bounded_memory(keys, kept, chars):
    made: list[str] = []

    def make(key: str) -> str:
        made.append(key)
        return key.upper() + "!"

    cache = stream.RecentItems()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream, "WORDS_KEPT", kept)
        patch.setattr(stream, "CHARS_KEPT", chars)
        for key in keys:
            present = key in cache or key in cache.previous
            made_before = len(made)
            assert cached(cache, key, make) == key.upper() + "!"
            assert len(made) == made_before + (not present)  # made only when forgotten
            assert key in cache and key not in cache.previous  # kept where it is found next
            assert len(cache) <= kept and len(cache.previous) <= kept
            assert cache.chars == sum(map(len, cache)) < chars + 6
            assert sum(map(len, cache.previous)) < chars + 6
    # a key used again before a generation fills is never made twice
    assert len(made) <= len(keys)


def test_recent_items_keep_a_key_in_use_however_many_others_pass():
    cache, made = stream.RecentItems(), []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream, "WORDS_KEPT", 4)
        for n in range(1000):  # "the" between 1000 words met once: emptying would forget it
            for key in ("the", f"word{n}"):
                cached(cache, key, lambda k: made.append(k) or k)
    assert made.count("the") == 1 and len(made) == 1001
    assert len(cache) <= 4 and len(cache.previous) <= 4


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(st.lists(st.sampled_from(PIECES), max_size=30).map("".join), max_size=8))
def test_encoding_with_small_generations_keeps_the_ids(tokenizer, texts):
    """Word, piece and chunk caches forgetting all the time: the ids of encode_chunk on each
    pre-split chunk, as always."""
    ranks: dict[bytes, int] = {}
    for i, token in enumerate(tokenizer.tokens):
        ranks.setdefault(token, i)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream, "WORDS_KEPT", 3)
        patch.setattr(stream, "CHARS_KEPT", 10)
        for text in texts * 2:
            expected = [i for chunk in tokenizer.pre_split(text)
                        for i in encode_chunk(chunk.encode("utf-8"), ranks)]
            assert tokenizer.encode_ordinary(text) == expected


# -- long runs ------------------------------------------------------------------------------------
# Text without spaces (one character repeated, DNA, base64) must not make prepare's memory grow
# with the longest run: runs longer than LONGEST_RUN are cut every that many characters (as
# Llama 3's tokenizer does); ordinary text is unaffected (the tiktoken and Hugging Face
# comparisons in test_tokenizer.py and above still hold). The bound is made small here so that
# the cuts happen in small texts; benchmarks/prepare_limits.py measures the memory.

BOUND = 7


RUN_PIECES = ["a", "aaaa", "b", " ", "   ", "\n", "\n\n  ", ",", ",,,", "1", "é", "'s", " x",
              "\t\t"]


@pytest.fixture
def small_bound(monkeypatch):
    monkeypatch.setattr(stream, "LONGEST_RUN", BOUND, raising=False)  # raising: the old code


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def run_tokenizer(request) -> BPETokenizer:
    training = "aaaa bbbb aaaa, cc!\n\n  " * 30 + "a" * 40 + " " * 30
    return BPETokenizer.train(training, 300, pattern=request.param)


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(RUN_PIECES) for _ in range(rng.randint(0, 40)))


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


def test_an_unbroken_text_is_encoded_in_pieces_of_the_bound(small_bound, run_tokenizer,
                                                             monkeypatch):
    longest = []
    encode = run_tokenizer._encode_chunks

    def spy(text):
        longest.append(len(text))
        return encode(text)

    monkeypatch.setattr(run_tokenizer, "_encode_chunks", spy)
    if run_tokenizer._words is not None:
        monkeypatch.setattr(run_tokenizer._words, "encode_text", spy)
        run_tokenizer._words.clear()
    ids = run_tokenizer.encode_ordinary("a" * 1000)
    assert run_tokenizer.decode(ids) == "a" * 1000
    assert max(longest) <= 2 * BOUND + 1  # was the whole 1,000


def test_encoding_cut_runs_is_the_same_whole_streamed_or_in_prepare_parts(
        small_bound, run_tokenizer, monkeypatch):
    monkeypatch.setattr(stream, "MIN_CHARS", 1)  # look for a cut after every part
    rng = random.Random(0)
    for _ in range(300):
        text = random_text(rng)
        whole = run_tokenizer.encode_ordinary(text)
        expected = [i for piece in stream.run_pieces(text)
                    for i in run_tokenizer.encode_ordinary(piece)]
        assert whole == expected
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 8))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert list(run_tokenizer.encode_iterable(pieces)) == whole
        for end in range(len(text) + 1):  # a settled cut of any prefix is settled in the whole
            cut = stream.settled_cut(text[:end], run_tokenizer.pre_split)
            assert (run_tokenizer.encode_ordinary(text[:cut])
                    + run_tokenizer.encode_ordinary(text[cut:])) == whole, (text, end, cut)


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


def test_special_sets_read_encodes_two_arguments_as_tiktoken_does():
    specials = {"<|endoftext|>": 300, "<|user|>": 301}
    assert special_sets(specials, (), "all") == (set(), set(specials))
    assert special_sets(specials, "all", "all") == (set(specials), set())
    assert special_sets(specials, {"<|user|>"}, ()) == ({"<|user|>"}, set())
    with pytest.raises(TypeError, match=r"not the string '<\|user\|>'"):
        special_sets(specials, "<|user|>", "all")
    with pytest.raises(ValueError, match=r"disallowed_special names \['<\|x\|>'\]"):
        special_sets(specials, (), {"<|x|>"})
