"""Tests for BPETokenizer.encode_iterable (tinygpt.stream): the ids of the joined text, however it
is cut into parts; lazy; and memory that does not grow with the length of the stream."""

from __future__ import annotations

import itertools
import random
import re
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tinygpt.stream as stream
from tinygpt.bpe import encode_chunk
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
