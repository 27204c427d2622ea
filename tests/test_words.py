"""Tests for cutting text into words (tinygpt.stream: split_at_spaces, words, word_cut,
WordCache), the fast path of BPETokenizer.encode_ordinary for GPT-2's and GPT-4's patterns:
every cut leaves the pattern's chunks as they are in the whole text (checked with the pattern
itself, on texts full of odd whitespace), and encoding word by word equals encoding chunk by
chunk and tiktoken."""

from __future__ import annotations

import pickle

import pytest
import regex
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygpt.stream as stream
from tinygpt.bpe import GPT2_PATTERN, GPT4_PATTERN
from tinygpt.stream import split_at_spaces, word_cut, words
from tinygpt.tokenizer import BPETokenizer

# pieces that stress the cut: every kind of whitespace before and after a space, contractions,
# digits, punctuation that GPT-4 glues to newlines, letters that GPT-4 glues to a symbol
PIECES = [" ", "  ", "\n", "\r\n", "\t", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2028",
          "\u3000", "a", "Hello", "é", "日本", "1", "2345", "'s", "'", "'LL", "!", "?!", ".",
          "-", "😀", " x", "\n\n", "   \n"]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
SETTINGS = settings(max_examples=400, deadline=None)
PATTERNS = pytest.mark.parametrize("name, pattern", [("gpt2", GPT2_PATTERN),
                                                    ("gpt4", GPT4_PATTERN)])
TRAINING = ("First Citizen: Before we proceed any further, hear me speak.\n\nAll: Speak, speak.\n"
            "It's 2024 and we've 1234567 reasons   to    go!?\r\n  \n\t\u3000日本 😀") * 20


def naive_word_cuts(text: str) -> list[int]:
    """Positions of the spaces that follow a non-space character, found one by one."""
    return [i for i, c in enumerate(text)
            if c == " " and i > 0 and not regex.match(r"\s", text[i - 1])]


def keeps_chunks(pieces: list[str], pattern: str, text: str) -> bool:
    """Whether ``pieces`` join to ``text`` and split into the chunks of the whole ``text``."""
    split = regex.compile(pattern).findall
    return "".join(pieces) == text and [c for p in pieces for c in split(p)] == split(text)


@PATTERNS
@SETTINGS
@given(TEXTS)
def test_pieces_between_spaces_and_words_split_into_the_chunks_of_the_whole_text(
        name, pattern, text):
    pieces = split_at_spaces(text)
    assert keeps_chunks([pieces[0], *(" " + p for p in pieces[1:])], pattern, text)
    found = words(text, name)
    assert keeps_chunks(found, pattern, text) and all(found)


def test_gpt2_words_see_whitespace_as_the_pattern_does():
    """GPT-2's words use the standard library's re (faster): its whitespace must be the
    pattern's (regex's \\s), code point by code point."""
    word = stream._WORDS["gpt2"]
    spaces = regex.compile(r"\s")
    differ = [c for c in map(chr, range(0x110000))
              if (len(word.findall("a" + c + "b")) == 2) != bool(spaces.match(c))]
    assert differ == []


def test_words_end_where_each_pattern_allows():
    text = " thee,\nAnd\n\nso"
    assert words(text, "gpt2") == [" thee,", "\nAnd", "\n\nso"]
    assert words(text, "gpt4") == [" thee,\n", "And", "\n\nso"]  # GPT-4 glues ",\n"
    gpt4 = regex.compile(GPT4_PATTERN).findall  # GPT-2's words would be wrong for GPT-4
    assert [c for w in words(text, "gpt2") for c in gpt4(w)] != gpt4(text)


@SETTINGS
@given(TEXTS)
def test_split_at_spaces_cuts_at_every_space_after_a_non_space(text):
    pieces = split_at_spaces(text)
    ends = [len(pieces[0])]
    for w in pieces[1:-1]:
        ends.append(ends[-1] + 1 + len(w))
    if text.startswith(" ") and pieces[0] == "":  # the fast path also cuts before a first space
        ends = ends[1:]
    assert ends[:len(pieces) - 1] == naive_word_cuts(text)


@PATTERNS
@SETTINGS
@given(TEXTS)
def test_word_cut_is_the_last_such_space_and_settled(name, pattern, text):
    cut = word_cut(text)
    assert cut == max(naive_word_cuts(text), default=0)
    assert keeps_chunks([text[:cut], text[cut:]], pattern, text)


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def tokenizer(request) -> BPETokenizer:
    return BPETokenizer.train(TRAINING, 330, pattern=request.param)


@SETTINGS
@given(TEXTS)
def test_encoding_word_by_word_equals_chunk_by_chunk_and_tiktoken(tokenizer, text):
    twin = tiktoken.Encoding("twin", pat_str=tokenizer.pattern, special_tokens={},
                             mergeable_ranks={t: i for i, t in enumerate(tokenizer.tokens)})
    assert tokenizer._words is not None  # the fast path is on for these patterns
    assert tokenizer.encode_ordinary(text) == tokenizer._encode_chunks(text)
    assert tokenizer.encode_ordinary(text) == twin.encode_ordinary(text)


def test_the_fast_path_is_only_for_patterns_that_allow_it():
    pattern = r"\w+ ?|\W"  # a word takes the space after it: cutting before that space is wrong
    split = regex.compile(pattern).findall
    assert split("ab cd") == ["ab ", "cd"] != split("ab") + split(" cd")
    custom = BPETokenizer.train(TRAINING, 300, pattern=pattern)
    assert custom._words is None and BPETokenizer.train(TRAINING, 300, None)._words is None
    twin = tiktoken.Encoding("twin", pat_str=pattern, special_tokens={},
                             mergeable_ranks={t: i for i, t in enumerate(custom.tokens)})
    assert custom.encode_ordinary(TRAINING) == twin.encode_ordinary(TRAINING)


def test_the_word_cache_stays_bounded(tokenizer, monkeypatch):
    monkeypatch.setattr(stream, "WORDS_KEPT", 50)
    name = "gpt2" if tokenizer.pattern == GPT2_PATTERN else "gpt4"
    cache = stream.WordCache(tokenizer._encode_chunks, name)
    long = " " + "x" * stream.LONGEST_WORD
    text = " ".join(f"w{i}" for i in range(500)) + long
    assert cache.encode(text).tolist() == tokenizer._encode_chunks(text)
    assert 0 < len(cache) <= 50 and len(cache.spaced) <= 50
    assert (len(cache.spaced) > 0) == cache.by_pieces == (name == "gpt4")
    assert long not in cache and long[:-1] in words(long[:-1], name)
    longer = "y" * (stream.LONGEST_WORD + 1)  # a piece after a space, longer than LONGEST_WORD
    assert cache.encode("a " + longer).tolist() == tokenizer._encode_chunks("a " + longer)
    assert longer not in cache.spaced
    words_text = "".join(f"\nw{i}" for i in range(500))  # no spaces: one piece, word by word
    assert cache.encode(words_text).tolist() == tokenizer._encode_chunks(words_text)
    assert 0 < len(cache) <= 50


def test_a_cached_piece_is_right_in_every_context(tokenizer):
    """A piece that ends a text (here with whitespace, which GPT-4's ``\\s++$`` splits apart) is
    cached; the same letters met again before a space, after a space after whitespace, or at
    the start must still give the chunks of their own text."""
    twin = tiktoken.Encoding("twin", pat_str=tokenizer.pattern, special_tokens={},
                             mergeable_ranks={t: i for i, t in enumerate(tokenizer.tokens)})
    texts = ["go to!\n\n", "go to!\n\n go", "to!\n\n", "go  to!\n\n", "go to!\n\nx to!",
             " to!\n\n", "go\n to!\n\n", "go to! to!\n\n\n", "go to!\n\n"]
    for text in texts:  # one tokenizer: each text meets the caches the ones before it filled
        assert tokenizer.encode_ordinary(text) == twin.encode_ordinary(text), text
    assert ("to!\n\n" in tokenizer._words.spaced) == (tokenizer.pattern == GPT4_PATTERN)


def test_a_pickled_tokenizer_leaves_its_caches_behind(tokenizer):
    tokenizer.encode_ordinary(TRAINING)
    assert len(tokenizer._words) + len(tokenizer._words.spaced) > 10
    copy = pickle.loads(pickle.dumps(tokenizer))
    assert len(copy._words) == 0 and len(copy._words.spaced) == 0 and copy._cache == {}
    assert copy.encode_ordinary(TRAINING) == tokenizer.encode_ordinary(TRAINING)
