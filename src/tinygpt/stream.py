"""Encoding a text that arrives in parts (a large file, line by line) in bounded memory.

BPE pre-splits text into chunks with a regular expression and encodes each chunk on its own, so a
text can be encoded piece by piece as long as it is cut only where a chunk boundary stays a
boundary whatever text follows. ``ready_prefix`` finds such a cut in a buffer: before its last
``HOLD`` chunks (GPT-2's and GPT-4's patterns look at most one character past a chunk, or to
the end of a run of one kind of character, so a boundary followed by two whole chunks is
settled), where the text before the cut, split on its own, gives the same chunks.
``StreamEncoding`` gives ``BPETokenizer`` its ``encode_iterable``. Memory is bounded by
``MIN_CHARS``, the longest part and the longest chunk, never by the whole text. It does not
handle special tokens (they are plain text, as in ``encode_ordinary``) or read files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

HOLD = 2  # chunks kept back at the end of the buffer: what follows may still change them
MIN_CHARS = 1 << 16  # characters gathered before a cut is looked for


def ready_prefix(buffer: str, split: Callable[[str], list[str]]) -> int:
    """The length of the longest prefix of ``buffer`` that ends on a settled chunk boundary, 0 if
    there is none: before the last ``HOLD`` chunks, and where the prefix on its own splits into
    the same chunks (at the end of a text, whitespace splits otherwise: GPT-4's ``\\s++$``).
    ``split`` must cover the text: its chunks joined are ``buffer``."""
    chunks = split(buffer)
    cut = len(buffer) - sum(len(c) for c in chunks[-HOLD:])
    for i in range(len(chunks) - HOLD, 0, -1):  # the prefix is chunks[:i]
        tail = chunks[max(0, i - HOLD):i]  # a match depends on no text before it: check these
        if split(buffer[cut - sum(map(len, tail)):cut]) == tail:
            return cut
        cut -= len(chunks[i - 1])
    return 0


def ready_texts(texts: Iterable[str], split: Callable[[str], list[str]],
                min_chars: int) -> Iterator[str]:
    """The text of ``texts`` joined, cut again into parts of about ``min_chars`` or more, each
    ending on a settled chunk boundary (the last part ends where the text does)."""
    buffer: list[str] = []
    size = 0
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts must yield str, got {type(text).__name__} at item {i}")
        buffer.append(text)
        size += len(text)
        if size < min_chars:
            continue
        joined = "".join(buffer)
        cut = ready_prefix(joined, split)
        if cut:
            yield joined[:cut]
        buffer, size = [joined[cut:]], len(joined) - cut
    if size:
        yield "".join(buffer)


class StreamEncoding:
    """``encode_iterable`` for a tokenizer with ``encode_ordinary``, ``pattern``, ``_split``
    (its pattern's ``findall``) and ``_covers`` (whether that pattern covers every text)."""

    pattern: str | None
    _split: Callable[[str], list[str]] | None
    _covers: bool

    def encode_iterable(self, texts: Iterable[str]) -> Iterator[int]:
        """The ids of ``"".join(texts)``, as ``encode_ordinary`` gives them, one by one and
        lazily: ``texts`` may be an open file (its lines) larger than memory."""
        if self._split is None or not self._covers:
            raise ValueError("encode_iterable cuts the text between pre-split chunks, so it "
                             "needs GPT-2's or GPT-4's pattern; this tokenizer has pattern "
                             f"{self.pattern!r} (encode the whole text with encode_ordinary)")
        if isinstance(texts, str):
            raise TypeError("texts must be an iterable of strings (lines, say), not one string: "
                            "pass [text]")
        return self._ids(texts, self._split)

    def _ids(self, texts: Iterable[str], split: Callable[[str], list[str]]) -> Iterator[int]:
        for part in ready_texts(texts, split, MIN_CHARS):
            yield from self.encode_ordinary(part)
