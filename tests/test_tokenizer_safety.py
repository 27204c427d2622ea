"""Issue 16, items 4-6 for the tokenizer: clear messages, no silent change of the text, and BPE
training that stays near-linear on text without spaces. One test per finding."""

from __future__ import annotations

import json
import random

import pytest

from tinygpt.bpe import train_merges, train_merges_naive
from tinygpt.tokenizer import BPETokenizer

TEXT = "Hello, world! The cat sat on the mat.\n" * 20


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer.train(TEXT, 300, special_tokens=["<|endoftext|>"])


@pytest.mark.parametrize("prompt, position", [("ab\ud800cd", 2), ("héllo wörld \udc80x", 12)])
def test_lone_surrogate_reports_its_position_in_the_text(tok, prompt, position):
    for encode in (tok.encode, tok.encode_ordinary):
        with pytest.raises(ValueError, match=f"at position {position} is a lone surrogate"):
            encode(prompt)


def test_edited_special_token_says_what_is_wrong_not_id_299_got_299(tok, tmp_path):
    path = tmp_path / "tok.json"
    tok.save(path)
    model = json.loads(path.read_text())
    eot = model["special_tokens"]["<|endoftext|>"]
    model["tokens"][eot] = b"<|endoftext!>".hex()  # the bytes edited, the id left alone
    path.write_text(json.dumps(model))
    with pytest.raises(ValueError) as caught:
        BPETokenizer.load(path)
    message = str(caught.value)
    assert f"must have id {eot}, got {eot}" not in message
    assert "<|endoftext!>" in message and str(eot) in message


def test_pattern_that_does_not_cover_the_text_is_refused_in_train():
    with pytest.raises(ValueError, match=r"does not cover the text: ', ' at position 5"):
        BPETokenizer.train("Hello, world!", 260, pattern=r"\w+")


def test_pattern_that_does_not_cover_the_text_is_refused_in_encode(tok):
    words_only = BPETokenizer(tok.tokens, tok.merges, r"\w+", tok.special_tokens)
    assert words_only.decode(words_only.encode("Helloworld")) == "Helloworld"
    with pytest.raises(ValueError, match="at position 5"):
        words_only.encode("Hello, world!")


def test_a_covering_custom_pattern_still_trains_and_round_trips():
    text = "Hello, world!\r\nagain\r"
    custom = BPETokenizer.train(text * 5, 270, pattern=r"\w+|\s+|.")
    assert custom.decode(custom.encode(text)) == text


def test_crlf_and_cr_round_trip_as_bytes(tok):
    text = "one\r\ntwo\rthree\n"
    assert tok.decode_bytes(tok.encode(text)) == text.encode("utf-8")


def test_dna_like_text_without_spaces_trains_the_same_merges_as_naive():
    """The fast trainer touches only a merge's occurrences; one endless chunk (no pre-split
    boundary) must still give the textbook's merges, overlapping runs included."""
    rng = random.Random(0)
    dna = "".join(rng.choices("ACGT", k=3000))
    chunks = [dna, "A" * 500, dna[:700]]
    assert train_merges(chunks, 60) == train_merges_naive(chunks, 60)
    assert BPETokenizer.train(dna, 300).decode(BPETokenizer.train(dna, 300).encode(dna)) == dna
