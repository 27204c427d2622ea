"""Tokenizers: text to a list of integer ids and back.

Chapter 1 builds it.

:class:`CharTokenizer` gives one id per distinct character of a text; :class:`BPETokenizer` is
byte-level byte-pair encoding as in GPT-2 and GPT-4: training, encoding with special tokens
(tiktoken's rules), decoding, and its own JSON file. The BPE algorithms live in :mod:`tinygpt.bpe`,
streaming (``encode_iterable``) in :mod:`tinygpt.stream`, GPT-2's files in :mod:`tinygpt.gpt2`."""

from __future__ import annotations

import json
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal, Protocol, cast

import regex

from tinygpt.bpe import (
    GPT2_PATTERN,
    GPT4_PATTERN,
    Pair,
    check_covered,
    encode_chunk,
    resolve_pattern,
    split_text,
    train_merges,
)
from tinygpt.checks import (
    check_ids,
    check_instance,
    check_int,
    check_text,
)
from tinygpt.files.writing import write_atomically
from tinygpt.stream import (
    LONGEST_RUN,
    UINT32,
    RecentItems,
    StreamEncoding,
    WordCache,
    run_pieces,
    special_sets,
)


def _check_chars(chars: Sequence[str]) -> list[str]:
    """``chars`` as a list, if they are distinct single characters."""
    chars = list(chars)
    bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
    repeated = [c for c, k in Counter(chars).items() if k > 1] if not bad else []
    if bad or repeated:
        raise ValueError(f"chars must be distinct single characters: {(bad or repeated)[0]!r} "
                         f"is {'not a single character' if bad else 'repeated'}")
    return chars


def _check_known(text: str, stoi: dict[str, int]) -> None:
    """Raise a clear error unless ``text`` is a str of characters in ``stoi``."""
    check_instance(text, str, "text")
    pos = next((i for i, c in enumerate(text) if c not in stoi), None)
    if pos is not None:
        raise ValueError(f"character {text[pos]!r} at position {pos} is not in the "
                         f"vocabulary of {len(stoi)} characters")


# --- the checks of a BPE vocabulary and of a training call ------------------------------------

def check_vocabulary(tokens: list[bytes], merges: list[tuple[int, int]],
                     special_tokens: dict[str, int]) -> None:
    """Raise ValueError unless bytes, merges and specials make a consistent BPE vocabulary."""
    n = 256 + len(merges)
    if sorted(tokens[:256]) != [bytes([b]) for b in range(256)]:
        raise ValueError("ids 0..255 must be the 256 single bytes")
    if len(tokens) != n + len(special_tokens):
        raise ValueError(f"expected {n + len(special_tokens)} tokens (256 bytes, "
                         f"{len(merges)} merges, {len(special_tokens)} specials), "
                         f"got {len(tokens)}")
    for i, (a, b) in enumerate(merges):
        if not (0 <= a < 256 + i and 0 <= b < 256 + i
                and tokens[256 + i] == tokens[a] + tokens[b]):
            raise ValueError(f"merge {i} ({a}, {b}) does not make token {256 + i}")
    for j, (name, idx) in enumerate(special_tokens.items()):
        if not isinstance(name, str) or type(idx) is not int:
            raise ValueError(f"special token {name!r} has the id {idx!r}, a "
                             f"{type(idx).__name__}: special tokens must be strings with "
                             f"integer ids (this one should be {n + j})")
        if idx != n + j:
            raise ValueError(f"special token {name!r} must have id {n + j} (the ids after the "
                             f"{n} bytes and merges, in order), got {idx}")
        if tokens[idx] != name.encode("utf-8"):
            raise ValueError(f"token {idx}, special token {name!r}, must be the bytes of "
                             f"its name, got {tokens[idx]!r}")


def check_training(text: str, vocab_size: int, special_tokens: Iterable[str]) -> list[str]:
    """The special tokens as a list, once ``text``, ``vocab_size`` and they are valid."""
    check_text(text)
    specials = list(special_tokens)
    if isinstance(special_tokens, str) or not all(isinstance(t, str) and t for t in specials):
        raise TypeError("special_tokens must be an iterable of non-empty strings")
    if len(set(specials)) != len(specials):
        raise ValueError(f"special tokens must be distinct, got {specials}")
    if check_int(vocab_size, "vocab_size", low=0) < 256 + len(specials):
        raise ValueError(f"vocab_size must be at least 256 + {len(specials)} special "
                         f"tokens = {256 + len(specials)}, got {vocab_size}")
    return specials


def tokenizer_fingerprint(tokenizer: object) -> str:
    """A SHA-256 of everything that decides a tokenizer's ids (a char tokenizer's characters;
    BPE's tokens, merges, pattern and special tokens), the same however it was made or stored:
    two tokenizers of one type and size that encode differently have different fingerprints."""
    import hashlib

    if isinstance(tokenizer, CharTokenizer):
        content: object = {"type": "char", "chars": tokenizer.chars}
    elif isinstance(tokenizer, BPETokenizer):
        content = {"type": "bpe", "pattern": tokenizer.pattern,
                   "special_tokens": sorted(tokenizer.special_tokens.items()),
                   "tokens": [t.hex() for t in tokenizer.tokens],
                   "merges": [list(m) for m in tokenizer.merges]}
    else:
        raise TypeError(f"not a tinygpt tokenizer: {type(tokenizer).__name__}")
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


class CharTokenizer:
    """The simplest tokenizer: every character is a token, its id is its index in ``chars``."""

    def __init__(self, chars: Sequence[str]) -> None:
        self.chars: list[str] = _check_chars(chars)  # id -> character
        self.stoi = {c: i for i, c in enumerate(self.chars)}  # character -> id

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The tokenizer of the sorted distinct characters of ``text``."""
        check_instance(text, str, "text")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """The id of each character of ``text``."""
        _check_known(text, self.stoi)
        return [self.stoi[c] for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of the characters with these ids."""
        check_ids(ids, self.vocab_size)
        return "".join(self.chars[i] for i in ids)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def render_token(token: bytes) -> str:
    """A token's bytes as readable text, non-printable and invalid bytes escaped (``\\xe2``)."""
    shown = []
    # surrogateescape turns each invalid byte 0xXY into the lone surrogate U+DCXY
    for c in token.decode("utf-8", errors="surrogateescape"):
        if "\udc80" <= c <= "\udcff":
            shown.append(f"\\x{ord(c) - 0xDC00:02x}")
        elif c.isprintable() and c != "\\":
            shown.append(c)
        else:
            shown.append(repr(c)[1:-1])  # \n, \t, \\, \x0b, \u200b...
    return "".join(shown)


EOT = "<|endoftext|>"  # the special token between documents: GPT-2's (its last id, 50256)
_FORMAT, _VERSION = "tinygpt-bpe", 1


class BPETokenizer(StreamEncoding):
    """Byte-level BPE: ``tokens[i]`` is the bytes of id ``i``: the 256 single bytes, then one
    token per merge, then the specials. A token's id is its *rank* for :func:`encode_chunk`
    (tiktoken's rule), so GPT-2's files (:mod:`tinygpt.gpt2`) encode exactly like GPT-2."""

    def __init__(self, tokens: Sequence[bytes], merges: Sequence[Pair],
                 pattern: str | None, special_tokens: dict[str, int] | None = None) -> None:
        tokens = [bytes(t) for t in tokens]
        merges = cast(list[Pair], [tuple(m) for m in merges])  # pairs: check_vocabulary checks
        special_tokens = dict(special_tokens or {})
        check_vocabulary(tokens, merges, special_tokens)
        n = 256 + len(merges)
        self.tokens: list[bytes] = tokens
        self.merges: list[Pair] = merges
        self.pattern: str | None = resolve_pattern(pattern)
        self.special_tokens: dict[str, int] = special_tokens
        # bytes -> rank; if two merges make the same bytes, the lowest id is the one encoded
        self._ranks = {t: i for i, t in reversed(list(enumerate(tokens[:n])))}
        self.pre_split = regex.compile(self.pattern).findall if self.pattern else None
        self._covers = self.pattern in (None, GPT2_PATTERN, GPT4_PATTERN)  # by construction
        self._new_caches()

    def _new_caches(self) -> None:
        self._cache: RecentItems[list[int]] = RecentItems()  # chunk -> ids, the chunks in use
        known = {GPT2_PATTERN: "gpt2", GPT4_PATTERN: "gpt4"}.get(self.pattern or "")  # cut at words
        self._words = WordCache(self._encode_chunks, known) if known else None

    def __getstate__(self) -> dict:  # what pickle sends to a worker process: no caches
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_words")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._new_caches()

    @classmethod
    def train(cls, text: str, vocab_size: int, pattern: str | None = "gpt4",
              special_tokens: Iterable[str] = (), progress: bool = False) -> BPETokenizer:
        """Learn ``vocab_size`` tokens (256 bytes + merges + specials) on ``text``, pre-split by
        ``pattern`` (a name from :data:`tinygpt.bpe.PATTERNS`, a regex, or None); no merge
        crosses a special token. A tiny text may run out of pairs first: fewer tokens."""
        specials = check_training(text, vocab_size, special_tokens)
        pieces = [text]
        if specials:
            pieces = regex.split("|".join(regex.escape(s) for s in specials), text)
        rx = resolve_pattern(pattern)
        chunks = Counter(c for piece in pieces
                         for c in check_covered(split_text(piece, rx), piece, rx))
        merges = train_merges(chunks, vocab_size - 256 - len(specials), progress=progress)
        tokens = [bytes([b]) for b in range(256)]
        for a, b in merges:
            tokens.append(tokens[a] + tokens[b])
        n = len(tokens)
        tokens += [s.encode("utf-8") for s in specials]
        return cls(tokens, merges, pattern, {s: n + j for j, s in enumerate(specials)})

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (see :func:`render_token` to show them)."""
        check_ids([token_id], self.vocab_size)
        return self.tokens[token_id]

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={self.special_tokens})")

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ``text`` with no special-token handling (a special token is plain text). A run
        of whitespace, or of other characters, longer than ``tinygpt.stream.LONGEST_RUN``
        (25,000) is cut every that many characters and the pieces encoded on their own, as Llama
        3 does: only there can the ids differ from tiktoken's, and memory stays bounded."""
        return self.encode_array(text).tolist()

    def encode_array(self, text: str) -> array:
        """``encode_ordinary``'s ids as an ``array`` of unsigned 32-bit ints (``"I"``), without
        a Python int per id: what ``tinygpt prepare`` writes to shards."""
        check_text(text)
        if self._words is not None:  # GPT-2's or GPT-4's pattern: each distinct word once
            return self._words.encode(text)
        return array(UINT32, self._encode_chunks(text))

    def _encode_chunks(self, text: str) -> list[int]:
        chunks: list[str] = []
        # long runs cut (tinygpt.stream); a text no longer than a run has none to cut
        for piece in run_pieces(text) if len(text) > LONGEST_RUN else [text] if text else []:
            found = self.pre_split(piece) if self.pre_split else [piece]
            if not self._covers:
                check_covered(found, piece, self.pattern)
            chunks += found
        cache, ranks, out = self._cache, self._ranks, []
        for chunk in chunks:
            ids = cache.get(chunk) or cache.recall(chunk)
            if ids is None:
                ids = encode_chunk(chunk.encode("utf-8"), ranks)
                if len(chunk) < 256:  # remember short chunks: words repeat, long runs rarely
                    cache.remember(chunk, ids)
            out += ids
        return out

    def encode(self, text: str, allowed_special: Iterable[str] | Literal["all"] = (),
               disallowed_special: Iterable[str] | Literal["all"] = "all") -> list[int]:
        """Encode ``text`` with tiktoken's rules: a special token in ``allowed_special`` (a set,
        or ``"all"``) becomes its id; one in ``disallowed_special`` (``"all"``: every special
        not allowed) is an error; one in neither is encoded as ordinary text."""
        check_text(text)
        allowed, disallowed = special_sets(self.special_tokens, allowed_special,
                                           disallowed_special)
        if disallowed:
            found = regex.search("|".join(map(regex.escape, disallowed)), text)
            if found:
                raise ValueError(
                    f"text contains the special token {found.group()!r} at position "
                    f"{found.start()}, which is disallowed. To encode it as its special id, "
                    f"pass allowed_special={{{found.group()!r}}} (or 'all'); to encode it "
                    "as ordinary text, pass disallowed_special=().")
        if not allowed:
            return self.encode_ordinary(text)
        # longest first, so that a special token that contains another one wins
        specials = sorted(allowed, key=len, reverse=True)
        out, start = [], 0
        for m in regex.finditer("|".join(map(regex.escape, specials)), text):
            out += self.encode_ordinary(text[start:m.start()])
            out.append(self.special_tokens[m.group()])
            start = m.end()
        return out + self.encode_ordinary(text[start:])

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The bytes of the tokens, joined."""
        check_ids(ids, self.vocab_size)
        return b"".join([self.tokens[i] for i in ids])

    def decode(self, ids: Sequence[int]) -> str:
        """The text of the tokens; bytes that end mid-character become U+FFFD ('�')."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def save(self, path: str | Path) -> None:
        """Write the model as JSON to ``path``, and to ``path`` + ``.vocab`` one line per token:
        its id, its bytes (:func:`render_token`) and, for a merged token, the two it joins."""
        path = Path(path)
        vocab_path = path.with_suffix(".vocab")
        if vocab_path == path:
            raise ValueError(f"{path}: the model file must not end in .vocab")
        model = {"format": _FORMAT, "version": _VERSION, "pattern": self.pattern,
                 "special_tokens": self.special_tokens,
                 "tokens": [t.hex() for t in self.tokens],
                 "merges": [list(m) for m in self.merges]}
        write_atomically(json.dumps(model).encode("utf-8"), path)
        shown = [f"[{render_token(t)}]" for t in self.tokens]
        lines = [f"{i}\t{s}" for i, s in enumerate(shown)]
        for i, (a, b) in enumerate(self.merges):
            lines[256 + i] += f"\t= {shown[a]} + {shown[b]}"
        for i in self.special_tokens.values():
            lines[i] += "\tspecial"
        write_atomically(("\n".join(lines) + "\n").encode("utf-8"), vocab_path)

    @classmethod
    def load(cls, path: str | Path, data: bytes | None = None,
             pattern: str | None = None) -> BPETokenizer:
        """Read a tokenizer written by :meth:`save` (or from ``data``, the file's bytes, when the
        caller has read and checked them already); ValueError naming the file if it is not one.

        The file's pre-split pattern must be GPT-2's, GPT-4's or none, or else the ``pattern``
        given (a name or the regex itself): a regular expression read from a file could take
        forever to match (catastrophic backtracking), so only a known one is compiled."""
        try:
            raw = Path(path).read_bytes() if data is None else data
            model = json.loads(raw.decode("utf-8"))
            if not isinstance(model, dict) or model.get("format") != _FORMAT:
                raise ValueError(f"not a {_FORMAT} model file")
            if model.get("version") != _VERSION:
                raise ValueError(f"version {model.get('version')!r} is not supported "
                                 f"(expected {_VERSION})")
            tokens = [bytes.fromhex(t) for t in model["tokens"]]
            merges = [(int(a), int(b)) for a, b in model["merges"]]
            known = (None, GPT2_PATTERN, GPT4_PATTERN, resolve_pattern(pattern))
            if model["pattern"] not in known:
                raise ValueError(
                    f"its pre-split pattern {str(model['pattern'])[:80]!r} is not GPT-2's or "
                    "GPT-4's; a pattern read from a file is compiled only when known (one could "
                    "take forever to match): if it is yours, pass it, "
                    "BPETokenizer.load(path, pattern=...)")
            return cls(tokens, merges, model["pattern"], model["special_tokens"])
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
                ValueError, AttributeError) as err:
            raise ValueError(f"cannot load a tokenizer from {path}: {err}") from None
        except RecursionError:
            raise ValueError(f"cannot load a tokenizer from {path}: not a {_FORMAT} model "
                             "file (JSON nested too deeply)") from None


class Tokenizer(Protocol):
    """What using a model needs of a tokenizer: ``vocab_size``, ``encode`` and ``decode``.

    ``CharTokenizer`` and ``BPETokenizer`` are tokenizers; so is any class of your own with
    these three (sampling and the book's widgets take one). Checkpoints and shards store only
    the two of this module: that is a ``SavedTokenizer``."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


SavedTokenizer = CharTokenizer | BPETokenizer  # the tokenizers a checkpoint or shards can hold
