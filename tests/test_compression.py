"""tinygpt.book.compression: code lengths under gzip, bzip2, xz and PPMd, and their rung beside the
ladder (tinygpt.book.ladder.compression_ladder).

The code lengths are checked against the compressors themselves (what they write decompresses
to the text), and by properties every compressor of text must have: text that repeats its
context costs less given the context than alone, and a copy of the context costs PPMd and xz
almost nothing. The ladder's compressors run on a small corpus and a private cache.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import math

import pyppmd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.book import compression, ladder
from tinygpt.book.compression import Compressor, code_length

SMALL_PPMD = 1 << 20  # a megabyte of model: plenty for the texts of these tests
ALL = [Compressor("gzip"), Compressor("bzip2"), Compressor("xz"),
       Compressor("ppmd", 3, SMALL_PPMD), Compressor("ppmd", 8, SMALL_PPMD)]
SPEECH = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
          "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of "
          "troubles\nAnd by opposing end them. To die: to sleep;\n")
letters = st.text(alphabet="abcdefghij klmnop\nqrstuvwxyzé,.", min_size=1, max_size=400)


def decompress(compressor: Compressor, packed: bytes, size: int) -> bytes:
    if compressor.kind == "gzip":
        return gzip.decompress(packed)
    if compressor.kind == "bzip2":
        return bz2.decompress(packed)
    if compressor.kind == "xz":
        return lzma.decompress(packed)
    decoder = pyppmd.Ppmd7Decoder(compressor.order, compressor.memory)  # variant H
    return decoder.decode(packed, size)


@pytest.mark.parametrize("compressor", ALL, ids=lambda c: c.title)
def test_the_code_length_is_what_the_compressor_writes_and_it_decompresses(compressor):
    text = SPEECH * 3 + "Ay, there's the rub — ô"
    raw = text.encode("utf-8")
    packed = compressor.compress(raw)
    assert decompress(compressor, packed, len(raw)) == raw
    alone = code_length(compressor, text)
    assert alone.bits == 8 * len(packed) and not alone.given_context
    given = code_length(compressor, text, SPEECH)
    assert given.bits == 8 * (len(compressor.compress(SPEECH.encode() + raw))
                              - len(compressor.compress(SPEECH.encode())))


@pytest.mark.parametrize("compressor", ALL, ids=lambda c: c.title)
def test_units_are_per_character_of_the_text_not_per_byte(compressor):
    text = "été à l'île " * 40  # 12 characters, 16 bytes of UTF-8 each time
    measured = code_length(compressor, text)
    assert measured.chars == len(text) == 480
    assert measured.utf8_bytes == len(text.encode("utf-8")) == 640
    assert measured.bits_per_char == measured.bits / 480
    assert measured.nats_per_char == pytest.approx(measured.bits / 480 * math.log(2), rel=1e-12)
    row = measured.to_json()
    assert row["nats_per_char"] == measured.nats_per_char and row["chars"] == 480


@pytest.mark.parametrize("compressor", ALL, ids=lambda c: c.title)
def test_text_that_repeats_its_context_costs_less_given_it_and_never_below_zero(compressor):
    context = SPEECH * 4
    given = code_length(compressor, SPEECH, context)
    alone = code_length(compressor, SPEECH)
    assert 0 <= given.bits < alone.bits / 2, (given.bits, alone.bits)


@settings(max_examples=25, deadline=None)
@given(text=letters, context=letters)
def test_ppmds_conditional_code_length_is_never_negative(text, context):
    for order in (3, 8):
        assert code_length(Compressor("ppmd", order, SMALL_PPMD), text, context).bits >= 0


@settings(max_examples=15, deadline=None)
@given(piece=st.text(alphabet="abcdefghijklmnopqrstuvwxyz ,.\n", min_size=40, max_size=120))
def test_a_copy_of_the_context_costs_ppmd_and_xz_almost_nothing(piece):
    text = (piece * (3000 // len(piece) + 1))[:3000]  # 3,000 characters
    for compressor in (Compressor("xz"), Compressor("ppmd", 8, SMALL_PPMD)):
        given = code_length(compressor, text, text)
        alone = code_length(compressor, text)
        assert given.bits_per_char < 0.1, (compressor.title, given.bits_per_char)
        assert given.bits < alone.bits


@pytest.mark.parametrize("bad, match", [
    (dict(kind="zip"), "compressor kind"),
    (dict(kind="ppmd"), "PPMd order"),
    (dict(kind="ppmd", order=1), "PPMd order"),
    (dict(kind="ppmd", order=8, memory=10), "PPMd memory"),
    (dict(kind="gzip", order=3), "order is PPMd's setting"),
])
def test_a_bad_compressor_is_refused_by_name(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        Compressor(**bad)


def test_bad_text_is_refused_by_name():
    with pytest.raises(ValueError, match="at least one character"):
        code_length(Compressor("gzip"), "")
    with pytest.raises(ValueError, match="lone surrogate"):
        code_length(Compressor("gzip"), "ab\ud800")
    with pytest.raises(TypeError, match="context must be a str"):
        code_length(Compressor("gzip"), "ab", b"x")
    with pytest.raises(TypeError, match="compressor must be a Compressor"):
        code_length("gzip", "ab")


def test_the_ladders_compressors_read_the_books_split_and_are_cached(ladder_corpus, monkeypatch):
    monkeypatch.setattr(ladder, "COMPRESSORS", tuple(
        ladder.CompressorRung(r.key, Compressor(r.compressor.kind, r.compressor.order,
                                                SMALL_PPMD) if r.compressor.order else
                              r.compressor, r.given_train, r.models)
        for r in ladder.COMPRESSORS))
    train_text, val_text = ladder.book_texts()
    tok = ladder_corpus.tokenizer
    assert train_text == tok.decode(ladder_corpus.train)
    assert val_text == tok.decode(ladder_corpus.val)
    calls = []
    real = compression.code_length

    def counted(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(ladder, "code_length", counted)
    first = ladder.compression_ladder()
    assert [r.key for r, _ in first] == ["gzip", "bzip2", "xz", "ppmd3", "ppmd8", "ppmd8_alone"]
    assert len(calls) == 6
    for (rung, row), (compressor, text, context) in zip(first, calls):
        assert compressor == rung.compressor and text == val_text
        assert context == (train_text if rung.given_train else "")
        assert row["nats_per_char"] == pytest.approx(
            real(compressor, text, context).nats_per_char)
    again = ladder.compression_ladder()
    assert len(calls) == 6 and [row for _, row in again] == [row for _, row in first]
