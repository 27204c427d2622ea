"""Tests of tinygpt.tokenizer: CharTokenizer and BPETokenizer.

The main reference is tiktoken: an Encoding built from the same ranks must give the same
ids, for GPT-2's tokenizer and for tokenizers trained here. HF tokenizers is a second,
independent reference for GPT-2.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tiktoken
from conftest import FOLDER_TEXT, REDOS, require_data
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.bpe import GPT2_PATTERN, PATTERNS, split_text
from tinygpt.gpt2 import load_tokenizer
from tinygpt.tokenizer import (
    EOT,
    BPETokenizer,
    CharTokenizer,
    render_token,
)

FAST = settings(max_examples=80, deadline=None)
# See tests/test_bpe.py: unassigned code points are left out when comparing libraries.
ASSIGNED_TEXT = st.text(st.characters(exclude_categories=("Cn", "Cs")), max_size=300)

SAMPLES = [
    "",
    "Hello, world! It's a test; we'll see. They've gone, I'm here, you'd know.",
    "def f(x):\n    return x ** 2  # square\n\n\tprint(f(3))\n",
    "numbers 1234567890 3.14159 -42 1e-5 2024-01-01 100,000",
    "multiple     spaces\t\ttabs\n\n\nnewlines   \ntrailing spaces   ",
    "   leading spaces and a final newline\n",
    "emoji 😀👍🏽🇫🇷 and ❤️ family 👨‍👩‍👧",
    "中文字符，日本語のテキスト、한국어 텍스트",
    "accents: café naïve résumé Ångström Øre ŧ ß",
    "CAPS'S WE'LL 'tis o'clock ''quoted'' ' 's",
    " " * 700 + "x" + "\n" * 600 + "\t" * 3,
    "漢字" * 400 + " long runs " + "a" * 2000,
    "special <|endoftext|> in the middle <|endoftext|>",
]


def data_file(name: str) -> Path:
    """Path of a data file, under the shared policy of conftest (skip locally, fail in CI)."""
    return require_data(name)


def tiktoken_twin(tok: BPETokenizer, pattern: str | None = None) -> tiktoken.Encoding:
    """A tiktoken Encoding with the same ranks, pattern and special tokens as ``tok``."""
    n = 256 + len(tok.merges)
    ranks = {}
    for i, t in enumerate(tok.tokens[:n]):
        ranks.setdefault(t, i)
    return tiktoken.Encoding(name="twin", pat_str=pattern or tok.pattern or r"[\s\S]+",
                             mergeable_ranks=ranks, special_tokens=tok.special_tokens)


@pytest.fixture(scope="module")
def shakespeare() -> str:
    return data_file("tinyshakespeare").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def gpt2() -> BPETokenizer:
    return load_tokenizer(data_file("gpt2/vocab.json"), data_file("gpt2/merges.txt"))


@pytest.fixture(scope="module")
def gpt2_tiktoken() -> tiktoken.Encoding:
    """GPT-2 in tiktoken, with ranks read here straight from vocab.json."""
    byte_of = {}
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    byte_of.update({chr(b): b for b in printable})
    byte_of.update({chr(256 + k): b for k, b in enumerate(others)})
    vocab = json.loads(data_file("gpt2/vocab.json").read_text(encoding="utf-8"))
    ranks = {bytes(byte_of[c] for c in t): i for t, i in vocab.items() if t != EOT}
    return tiktoken.Encoding(name="gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: vocab[EOT]})


@pytest.fixture(scope="module")
def trained(shakespeare) -> BPETokenizer:
    return BPETokenizer.train(shakespeare[:50_000], 400, special_tokens=[EOT])


# ---------------------------------------------------------------- CharTokenizer
@FAST
@given(st.text(min_size=1, max_size=200))
def test_char_round_trip(text):
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.vocab_size == len(set(text)) and tok.chars == sorted(set(text))
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_char_errors():
    tok = CharTokenizer.from_text("hello")
    with pytest.raises(ValueError, match=r"'z' at position 3"):
        tok.encode("hel" + "z")
    with pytest.raises(ValueError, match=r"id 4.*0\.\.3"):
        tok.decode([0, 4])
    with pytest.raises(ValueError, match="-1"):
        tok.decode([-1])  # a negative id must not index from the end
    with pytest.raises(TypeError):
        tok.decode([1.5])
    with pytest.raises(TypeError):
        tok.encode(["h"])
    with pytest.raises(ValueError, match="repeated"):
        CharTokenizer(["a", "a"])
    with pytest.raises(ValueError, match="not a single character"):
        CharTokenizer(["ab"])


# ---------------------------------------------------------------- GPT-2, exactly
def test_gpt2_structure(gpt2):
    assert gpt2.vocab_size == 50257 and len(gpt2.merges) == 50000
    assert gpt2.special_tokens == {EOT: 50256}
    assert gpt2.pattern == GPT2_PATTERN
    a, b = gpt2.merges[0]  # the first line of merges.txt is "Ġ t"
    assert (gpt2.token_bytes(a), gpt2.token_bytes(b), gpt2.token_bytes(256)) == (b" ", b"t", b" t")


@pytest.mark.parametrize("text", SAMPLES)
def test_gpt2_matches_tiktoken_on_samples(gpt2, gpt2_tiktoken, text):
    assert gpt2.encode(text, disallowed_special=()) == gpt2_tiktoken.encode_ordinary(text)
    assert gpt2.encode(text, allowed_special="all") == gpt2_tiktoken.encode(
        text, allowed_special="all")
    assert gpt2.decode(gpt2.encode_ordinary(text)) == text


@FAST
@given(ASSIGNED_TEXT)
def test_gpt2_matches_tiktoken_on_random_text(gpt2, gpt2_tiktoken, text):
    assert gpt2.encode_ordinary(text) == gpt2_tiktoken.encode_ordinary(text)


@FAST
@given(st.lists(st.one_of(ASSIGNED_TEXT, st.just(EOT)), max_size=5))
def test_gpt2_special_tokens_match_tiktoken(gpt2, gpt2_tiktoken, parts):
    text = "".join(parts)
    assert gpt2.encode(text, allowed_special="all") == gpt2_tiktoken.encode(
        text, allowed_special="all")
    assert gpt2.encode(text, disallowed_special=()) == gpt2_tiktoken.encode(
        text, disallowed_special=())


def test_gpt2_matches_tiktoken_on_shakespeare(gpt2, gpt2_tiktoken, shakespeare):
    ids = gpt2.encode(shakespeare)
    assert ids == gpt2_tiktoken.encode_ordinary(shakespeare)
    assert gpt2.decode(ids) == shakespeare


@pytest.mark.parametrize("text", SAMPLES[:-1])
def test_gpt2_matches_hf_tokenizers(gpt2, text):
    from tokenizers import Tokenizer, models, pre_tokenizers
    hf = Tokenizer(models.BPE.from_file(str(data_file("gpt2/vocab.json")),
                                        str(data_file("gpt2/merges.txt"))))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert gpt2.encode(text) == hf.encode(text).ids


def test_gpt2_files_with_version_header_and_mismatch(gpt2, tmp_path):
    vocab, merges = data_file("gpt2/vocab.json"), data_file("gpt2/merges.txt")
    lines = merges.read_text(encoding="utf-8").splitlines()
    with_header = tmp_path / "merges.txt"
    with_header.write_text("#version: 0.2\n" + "\n".join(lines) + "\n", encoding="utf-8")
    again = load_tokenizer(vocab, with_header)
    assert again.merges == gpt2.merges and again.tokens == gpt2.tokens
    swapped = tmp_path / "swapped.txt"
    swapped.write_text("\n".join([lines[1], lines[0], *lines[2:]]), encoding="utf-8")
    with pytest.raises(ValueError, match="do not match"):
        load_tokenizer(vocab, swapped)
    with pytest.raises(ValueError, match="cannot read"):
        load_tokenizer(tmp_path / "missing.json", merges)


# ---------------------------------------------------------------- special tokens
def test_special_tokens(gpt2, gpt2_tiktoken):
    text = "a<|endoftext|>b"
    assert gpt2.encode(text, allowed_special={EOT}) == gpt2_tiktoken.encode(
        text, allowed_special={EOT})
    assert 50256 in gpt2.encode(text, allowed_special="all")
    plain = gpt2.encode(text, disallowed_special=())
    assert 50256 not in plain and plain == gpt2_tiktoken.encode(text, disallowed_special=())
    with pytest.raises(ValueError, match="disallowed"):
        gpt2.encode(text)
    with pytest.raises(TypeError, match="set of strings"):
        gpt2.encode(text, allowed_special=EOT)
    with pytest.raises(ValueError, match="not special tokens"):
        gpt2.encode(text, allowed_special={"<|nope|>"})
    with pytest.raises(TypeError, match="str"):
        gpt2.encode(b"bytes")


# ---------------------------------------------------------------- trained tokenizers
@pytest.mark.parametrize("pattern", ["gpt4", "gpt2", None])
def test_trained_tokenizer_matches_tiktoken(shakespeare, pattern):
    tok = BPETokenizer.train(shakespeare[:20_000], 300, pattern=pattern)
    assert tok.vocab_size == 300 and tok.pattern == PATTERNS.get(pattern)
    twin = tiktoken_twin(tok)
    for text in [shakespeare[20_000:24_000], *SAMPLES[:-1]]:
        assert tok.encode(text) == twin.encode_ordinary(text)
    # merges never cross chunk boundaries, except without a pattern
    split_by = pattern or "gpt2"
    crossing = [t for t in tok.tokens
                if len(split_text(t.decode("utf-8", "replace"), split_by)) > 1]
    assert (len(crossing) > 0) == (pattern is None)


@FAST
@given(st.text(max_size=300))
def test_trained_round_trip(trained, text):
    assert trained.decode(trained.encode_ordinary(text)) == text
    assert trained.decode_bytes(trained.encode_ordinary(text)) == text.encode("utf-8")


@FAST
@given(ASSIGNED_TEXT)
def test_trained_matches_tiktoken_on_random_text(trained, text):
    assert trained.encode(text, disallowed_special=()) == tiktoken_twin(trained).encode(
        text, disallowed_special=())


def test_train_special_tokens_and_validation(shakespeare):
    text = shakespeare[:5000] + EOT + shakespeare[5000:10_000]
    tok = BPETokenizer.train(text, 300, special_tokens=[EOT, "<|pad|>"])
    assert tok.special_tokens == {EOT: 298, "<|pad|>": 299}
    assert tok.encode(EOT + "hi", allowed_special="all")[0] == 298
    assert not any(b"<|" in t for t in tok.tokens[:298])  # nothing learned from the special
    with pytest.raises(ValueError, match="at least 256 \\+ 2"):
        BPETokenizer.train(text, 257, special_tokens=[EOT, "<|pad|>"])
    with pytest.raises(TypeError, match="int"):
        BPETokenizer.train(text, 300.0)
    with pytest.raises(TypeError, match="str"):
        BPETokenizer.train(b"bytes", 300)
    small = BPETokenizer.train("ab", 1000)  # runs out of pairs: fewer tokens than asked
    assert small.vocab_size == 257 and small.encode("ab") == [256]


def test_decode_errors_and_token_display(trained):
    n = trained.vocab_size
    with pytest.raises(ValueError, match=rf"id {n}.*0\.\.{n - 1}"):
        trained.decode([1, n])
    with pytest.raises(ValueError, match="-3"):
        trained.decode_bytes([-3])
    with pytest.raises(ValueError, match="99999"):
        trained.token_bytes(99999)
    euro = "€".encode()  # three bytes: a prefix of them is not valid UTF-8
    assert trained.decode([euro[0], euro[1]]) == "\ufffd"
    assert trained.decode_bytes([euro[0], euro[1]]) == euro[:2]
    assert render_token(b"a\nb\\") == "a\\nb\\\\" and render_token(b"\xe2") == "\\xe2"


# ---------------------------------------------------------------- files
def test_save_load_identity(trained, tmp_path):
    path = tmp_path / "tok.json"
    trained.save(path)
    again = BPETokenizer.load(path)
    for field in ("tokens", "merges", "pattern", "special_tokens", "vocab_size"):
        assert getattr(again, field) == getattr(trained, field)
    for text in SAMPLES:
        assert again.encode(text, allowed_special="all") == trained.encode(
            text, allowed_special="all")
    lines = (tmp_path / "tok.vocab").read_text(encoding="utf-8").splitlines()
    assert len(lines) == trained.vocab_size
    assert lines[10] == "10\t[\\n]"
    a, b = (render_token(trained.tokens[i]) for i in trained.merges[0])
    assert lines[256] == f"256\t[{render_token(trained.tokens[256])}]\t= [{a}] + [{b}]"


def test_load_rejects_bad_files(trained, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape("bad.json")):
        BPETokenizer.load(bad)
    good = tmp_path / "good.json"
    trained.save(good)
    model = json.loads(good.read_text(encoding="utf-8"))
    for change in [{"format": "other"}, {"version": 99}, {"merges": model["merges"][::-1]},
                   {"tokens": model["tokens"][:-5]}, {"special_tokens": {EOT: 5}}]:
        bad.write_text(json.dumps({**model, **change}), encoding="utf-8")
        with pytest.raises(ValueError, match=re.escape("bad.json")):
            BPETokenizer.load(bad)
    with pytest.raises(ValueError, match="missing"):
        BPETokenizer.load(tmp_path / "missing.json")


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


def test_a_special_token_with_an_id_that_is_not_an_integer_says_so(tmp_path):
    import json

    from tinygpt.tokenizer import BPETokenizer

    tok = BPETokenizer.train("hello world " * 20, 300, special_tokens=["<|endoftext|>"])
    path = tmp_path / "tok.json"
    tok.save(path)
    model = json.loads(path.read_text())
    eot = model["special_tokens"]["<|endoftext|>"]
    for bad in (str(eot), float(eot)):
        model["special_tokens"]["<|endoftext|>"] = bad
        path.write_text(json.dumps(model))
        with pytest.raises(ValueError) as caught:
            BPETokenizer.load(path)
        message = str(caught.value)
        assert f"must have id {eot}, got {bad}" not in message  # was "id 266, got 266"
        assert f"has the id {bad!r}, a {type(bad).__name__}" in message, message


# --- a pattern read from a file ------------------------------------------------------------------

def test_a_tokenizer_file_with_an_unknown_pattern_is_refused_unless_given(tmp_path):
    import json

    from tinygpt.tokenizer import BPETokenizer

    path = tmp_path / "tok.json"
    BPETokenizer.train(FOLDER_TEXT, 270).save(path)
    model = json.loads(path.read_text())
    model["pattern"] = REDOS
    path.write_text(json.dumps(model))
    with pytest.raises(ValueError, match=r"tok\.json.*not GPT-2.s or GPT-4.s"):
        BPETokenizer.load(path)
    mine = r"\w+|\s+|[^\w\s]+"  # a pattern of one's own is loaded when it is given
    BPETokenizer.train(FOLDER_TEXT, 270, pattern=mine).save(path)
    with pytest.raises(ValueError, match=r"pattern=\.\.\."):
        BPETokenizer.load(path)
    assert BPETokenizer.load(path, pattern=mine).pattern == mine
    for name in ("gpt2", "gpt4", "none"):
        BPETokenizer.train(FOLDER_TEXT, 270, pattern=name).save(path)
        BPETokenizer.load(path)

