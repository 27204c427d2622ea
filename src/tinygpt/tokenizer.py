"""Tokenizers: turning text into a list of integer ids and back.

What this module handles:

* :class:`CharTokenizer`, one id per distinct character of a training text;
* :class:`BPETokenizer`, byte-level byte-pair encoding as in GPT-2 and GPT-4: training
  on a text, encoding with special tokens (tiktoken's rules), decoding, saving to and
  loading from a JSON file, and loading GPT-2's own ``vocab.json`` / ``merges.txt``.

What it does not handle: the BPE algorithms themselves (pre-splitting, counting pairs,
learning merges, applying them), which live in :mod:`tinygpt.bpe`; and batching ids into
tensors, which is the job of the data pipeline.
"""

from __future__ import annotations

import json
import operator
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import regex

from tinygpt.bpe import (
    GPT2_PATTERN,
    GPT4_PATTERN,
    Pair,
    encode_chunk,
    resolve_pattern,
    split_text,
    train_merges,
)


def _check_text(text: object) -> str:
    """``text`` if it is a str that UTF-8 can encode; else TypeError, or ValueError naming the
    position of the first lone surrogate (U+D800..U+DFFF: half of a UTF-16 pair, not text)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    bad = regex.search("[\ud800-\udfff]", text)
    if bad:
        raise ValueError(f"character U+{ord(bad.group()):04X} at position {bad.start()} is a "
                         "lone surrogate, which is not text: UTF-8 cannot encode it")
    return text


def _uncovered(chunks: list[str], text: str) -> tuple[int, str] | None:
    """``(position, characters)`` of the first part of ``text`` that ``chunks``, the matches
    of a pre-split pattern in order, leave out; None if they join back to ``text``."""
    pos = 0
    for chunk in chunks:
        start = text.index(chunk, pos)
        if start > pos:
            return pos, text[pos:start]
        pos = start + len(chunk)
    return (pos, text[pos:]) if pos < len(text) else None


def _check_covered(chunks: list[str], text: str, pattern: str | None) -> list[str]:
    """``chunks`` if they join back to ``text``; else a ValueError: a pattern that skips
    characters would silently drop them from the tokens."""
    if sum(map(len, chunks)) == len(text):
        return chunks  # matches never overlap, so the same length means the whole text
    gap = _uncovered(chunks, text)
    if gap is None:
        return chunks
    pos, missing = gap
    raise ValueError(f"the pre-split pattern {pattern!r} does not cover the text: "
                     f"{missing[:20]!r} at position {pos} matches none of it and would be "
                     "lost; use a pattern that matches every character (e.g. end it with "
                     "|\\s+|.)")


def _check_ids(ids: Iterable[int], size: int) -> list[int]:
    """``ids`` as a list of ints in ``range(size)``, or a clear TypeError / ValueError."""
    try:
        ids = [operator.index(i) for i in ids]
    except TypeError:
        raise TypeError(f"ids must be an iterable of ints, got {type(ids).__name__} "
                        "holding a non-integer") from None
    if ids and (min(ids) < 0 or max(ids) >= size):
        bad = next(i for i in ids if not 0 <= i < size)
        raise ValueError(f"unknown token id {bad}: valid ids are 0..{size - 1}")
    return ids


class CharTokenizer:
    """The simplest tokenizer: every character is a token, the id is its index in ``chars``.

    Build it from a text with :meth:`from_text` (the sorted distinct characters of the
    text), or directly from a list of distinct characters.
    """

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        repeated = [c for c, k in Counter(chars).items() if k > 1] if not bad else []
        if bad or repeated:
            raise ValueError(f"chars must be distinct single characters: {(bad or repeated)[0]!r} "
                             f"is {'not a single character' if bad else 'repeated'}")
        self.chars: list[str] = chars
        self._stoi = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """A tokenizer whose vocabulary is the sorted set of characters of ``text``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        """Number of distinct tokens (characters)."""
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """The id of each character of ``text``; ValueError on a character not in the vocabulary."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        try:
            return [self._stoi[c] for c in text]
        except KeyError:
            pos = next(i for i, c in enumerate(text) if c not in self._stoi)
            raise ValueError(f"character {text[pos]!r} at position {pos} is not in the "
                             f"vocabulary of {self.vocab_size} characters") from None

    def decode(self, ids: Iterable[int]) -> str:
        """The text made of the characters with these ids; ValueError on an unknown id."""
        return "".join([self.chars[i] for i in _check_ids(ids, self.vocab_size)])

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def render_token(token: bytes) -> str:
    """A token's bytes shown readably: UTF-8 text, with non-printable characters and
    invalid bytes escaped (``\\n``, ``\\x0b``, ``\\xe2``...)."""
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


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte to a printable character, used in its vocabulary files.

    Printable Latin-1 bytes stand for themselves; the 68 others (controls, space, ...)
    get the characters 256, 257, ... in byte order, so a space is ``'Ġ'``.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in table]
    table.update({b: chr(256 + k) for k, b in enumerate(others)})
    return table


_FORMAT, _VERSION = "tinygpt-bpe", 1
_EOT = "<|endoftext|>"  # GPT-2's one special token
_CACHE_LIMIT = 200_000  # distinct chunks remembered by encode before the cache is reset


class BPETokenizer:
    """Byte-level BPE tokenizer: 256 byte tokens, one token per learned merge, then specials.

    The vocabulary is a list of byte strings, one per id. Ids ``0..255`` are the 256
    single bytes (in any order), id ``256 + i`` is made by merge ``i``, and special tokens
    follow. The id of a regular token is also its *rank*: encoding a chunk joins, again
    and again, the two adjacent parts whose concatenation has the lowest rank (see
    :func:`tinygpt.bpe.encode_chunk`). This is the rule of tiktoken, so a tokenizer built
    from GPT-2's files encodes exactly like GPT-2, without replaying its merge list.

    Build one with :meth:`train`, :meth:`load` or :meth:`from_gpt2`.
    """

    def __init__(self, tokens: Sequence[bytes], merges: Sequence[Pair],
                 pattern: str | None, special_tokens: dict[str, int] | None = None) -> None:
        """Check and store a vocabulary; raise ValueError if its parts do not agree."""
        tokens, merges = [bytes(t) for t in tokens], [tuple(m) for m in merges]
        special_tokens = dict(special_tokens or {})
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
            if idx != n + j:
                raise ValueError(f"special token {name!r} must have id {n + j}, got {idx}")
            if tokens[idx] != name.encode("utf-8"):
                raise ValueError(f"token {idx}, special token {name!r}, must be the bytes of "
                                 f"its name, got {tokens[idx]!r}")
        self.tokens: list[bytes] = tokens
        self.merges: list[Pair] = merges
        self.pattern: str | None = resolve_pattern(pattern)
        self.special_tokens: dict[str, int] = special_tokens
        # If two merges make the same bytes, the lowest id is the one encode produces.
        self._ranks: dict[bytes, int] = {}
        for i, t in enumerate(tokens[:n]):
            self._ranks.setdefault(t, i)
        self._split = regex.compile(self.pattern).findall if self.pattern else None
        self._covers = self.pattern in (None, GPT2_PATTERN, GPT4_PATTERN)  # by construction
        self._cache: dict[str, list[int]] = {}

    # ----------------------------------------------------------------- building
    @classmethod
    def train(cls, text: str, vocab_size: int, pattern: str | None = "gpt4",
              special_tokens: Iterable[str] = (), progress: bool = False) -> BPETokenizer:
        """Learn a tokenizer of ``vocab_size`` tokens (256 bytes + merges + specials) on ``text``.

        ``pattern`` is a name from :data:`tinygpt.bpe.PATTERNS`, a regex, or None. Special
        tokens are cut out of the text before training, so no merge is learned across or
        inside them. If the text runs out of pairs before enough merges are learned (a
        tiny text), the tokenizer has fewer tokens than asked: check ``vocab_size``.
        """
        _check_text(text)
        specials = list(special_tokens)
        if isinstance(special_tokens, str) or not all(isinstance(t, str) and t for t in specials):
            raise TypeError("special_tokens must be an iterable of non-empty strings")
        if len(set(specials)) != len(specials):
            raise ValueError(f"special tokens must be distinct, got {specials}")
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
            raise TypeError(f"vocab_size must be an int, not {type(vocab_size).__name__}")
        if vocab_size < 256 + len(specials):
            raise ValueError(f"vocab_size must be at least 256 + {len(specials)} special "
                             f"tokens = {256 + len(specials)}, got {vocab_size}")
        pieces = [text]
        if specials:
            pieces = regex.split("|".join(regex.escape(s) for s in specials), text)
        rx = resolve_pattern(pattern)
        chunks = Counter(c for piece in pieces
                         for c in _check_covered(split_text(piece, rx), piece, rx))
        merges = train_merges(chunks, vocab_size - 256 - len(specials), progress=progress)
        tokens = [bytes([b]) for b in range(256)]
        for a, b in merges:
            tokens.append(tokens[a] + tokens[b])
        n = len(tokens)
        tokens += [s.encode("utf-8") for s in specials]
        return cls(tokens, merges, pattern, {s: n + j for j, s in enumerate(specials)})

    @classmethod
    def from_gpt2(cls, vocab_json_path: str | Path, merges_txt_path: str | Path) -> BPETokenizer:
        """GPT-2's tokenizer from its ``vocab.json`` and ``merges.txt`` (``#version`` optional).

        The files spell bytes with GPT-2's printable characters (:func:`gpt2_bytes_to_unicode`),
        which are turned back into bytes. Raises ValueError if the files are unreadable or
        do not agree (e.g. merge ``i`` must make token ``256 + i``).
        """
        files = f"GPT-2 files {vocab_json_path} and {merges_txt_path}"
        decoder = {ch: b for b, ch in gpt2_bytes_to_unicode().items()}
        try:
            vocab = json.loads(Path(vocab_json_path).read_text(encoding="utf-8"))
            lines = Path(merges_txt_path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"cannot read {files}: {err}") from None
        try:
            eot_id = vocab.pop(_EOT)
            by_id = sorted((i, t) for t, i in vocab.items())
            if [i for i, _ in by_id] != list(range(len(by_id))):
                raise ValueError("the ids of vocab.json are not 0, 1, 2... without gaps")
            tokens = [bytes(decoder[ch] for ch in t) for _, t in by_id]
            ids = {t: i for i, t in enumerate(tokens)}
            merges = []
            for line in lines:
                if line.strip() and not line.startswith("#version"):
                    a, b = (bytes(decoder[ch] for ch in part) for part in line.split(" "))
                    merges.append((ids[a], ids[b]))
            return cls(tokens + [_EOT.encode()], merges, "gpt2", {_EOT: eot_id})
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{files} do not match or are not GPT-2's: "
                             f"{type(err).__name__} {err}") from None

    @property
    def vocab_size(self) -> int:
        """Number of tokens: 256 bytes + merges + special tokens."""
        return len(self.tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (see :func:`render_token` to show them)."""
        return self.tokens[_check_ids([token_id], self.vocab_size)[0]]

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={self.special_tokens})")

    # ----------------------------------------------------------------- encoding
    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ``text`` with no special-token handling (a special token is plain text)."""
        _check_text(text)
        chunks = self._split(text) if self._split else ([text] if text else [])
        if not self._covers:
            _check_covered(chunks, text, self.pattern)
        cache, ranks, out = self._cache, self._ranks, []
        for chunk in chunks:
            ids = cache.get(chunk)
            if ids is None:
                ids = encode_chunk(chunk.encode("utf-8"), ranks)
                if len(chunk) < 256:  # remember short chunks: words repeat, long runs rarely
                    if len(cache) >= _CACHE_LIMIT:
                        cache.clear()
                    cache[chunk] = ids
            out += ids
        return out

    def encode(self, text: str, allowed_special: Iterable[str] | Literal["all"] = (),
               disallowed_special: Iterable[str] | Literal["all"] = "all") -> list[int]:
        """Encode ``text`` into token ids, with tiktoken's rules for special tokens.

        A special token in ``allowed_special`` (a set of strings, or ``"all"``) becomes its
        single id. A special token in ``disallowed_special`` (``"all"``: every special not
        allowed) raises ValueError if it appears in the text. A special token in neither
        (``disallowed_special=()``) is encoded as ordinary text.
        """
        _check_text(text)
        allowed = self._special_set(allowed_special, "allowed_special")
        if disallowed_special == "all":
            disallowed = set(self.special_tokens) - allowed
        else:
            disallowed = self._special_set(disallowed_special, "disallowed_special")
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

    def _special_set(self, value: Iterable[str] | str, name: str) -> set[str]:
        """``"all"`` or an iterable of special-token strings, as a set; errors on anything else."""
        if value == "all":
            return set(self.special_tokens)
        if isinstance(value, str):
            raise TypeError(f"{name} must be 'all' or a set of strings such as "
                            f"{{{value!r}}}, not the string {value!r}")
        result = set(value)
        unknown = result - set(self.special_tokens)
        if unknown:
            raise ValueError(f"{name} names {sorted(unknown)}, which are not special tokens "
                             f"of this tokenizer (it has {sorted(self.special_tokens)})")
        return result

    # ----------------------------------------------------------------- decoding
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of the tokens, joined; ValueError on an unknown id."""
        return b"".join([self.tokens[i] for i in _check_ids(ids, self.vocab_size)])

    def decode(self, ids: Iterable[int]) -> str:
        """The text of the tokens. A token may hold part of a UTF-8 character, so a list of
        ids can end mid-character: such invalid bytes become U+FFFD ('�', errors="replace")."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # ----------------------------------------------------------------- files
    def save(self, path: str | Path) -> None:
        """Write the model as JSON to ``path`` and a readable vocabulary to ``path`` + ``.vocab``.

        Each line of the ``.vocab`` file is: id, the token (:func:`render_token`), and for
        a merged token the two tokens it was made from.
        """
        path = Path(path)
        vocab_path = path.with_suffix(".vocab")
        if vocab_path == path:
            raise ValueError(f"{path}: the model file must not end in .vocab")
        model = {"format": _FORMAT, "version": _VERSION, "pattern": self.pattern,
                 "special_tokens": self.special_tokens,
                 "tokens": [t.hex() for t in self.tokens],
                 "merges": [list(m) for m in self.merges]}
        path.write_text(json.dumps(model), encoding="utf-8")
        shown = [f"[{render_token(t)}]" for t in self.tokens]
        lines = [f"{i}\t{s}" for i, s in enumerate(shown)]
        for i, (a, b) in enumerate(self.merges):
            lines[256 + i] += f"\t= {shown[a]} + {shown[b]}"
        for i in self.special_tokens.values():
            lines[i] += "\tspecial"
        vocab_path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path, data: bytes | None = None) -> BPETokenizer:
        """Read a tokenizer written by :meth:`save`; ValueError naming the file if it is not one.

        ``data``: the file's bytes, when the caller has read (and checked) them already.
        """
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
            return cls(tokens, merges, model["pattern"], model["special_tokens"])
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
                ValueError) as err:
            raise ValueError(f"cannot load a tokenizer from {path}: {err}") from None
