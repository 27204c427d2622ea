"""Encoding a text that arrives in parts (a large file, line by line) in bounded memory.

BPE pre-splits text into chunks with a regular expression and encodes each chunk on its own, so a
text can be encoded piece by piece as long as it is cut only where a chunk boundary stays a
boundary whatever text follows. ``ready_prefix`` finds such a cut in a buffer: before its last
``HOLD`` chunks (GPT-2's and GPT-4's patterns look at most one character past a chunk, or to
the end of a run of one kind of character, so a boundary followed by two whole chunks is
settled), where the text before the cut, split on its own, gives the same chunks.
``StreamEncoding`` gives ``BPETokenizer`` its ``encode_iterable``. Memory is bounded by
``MIN_CHARS``, the longest part and the longest chunk, never by the whole text. Runs longer than
``LONGEST_RUN`` characters are cut (``run_cuts``) before anything else, so no chunk of GPT-2's or
GPT-4's pattern is longer than ``2 * LONGEST_RUN + 1`` characters, and such cuts are settled.

GPT-2's and GPT-4's patterns also allow cuts found without the pattern, by looking at the two
characters around them, because a match depends on no text before it and no chunk runs from a
non-space character into whitespace (but GPT-4's punctuation-with-line-breaks, ``",\\n"``):
a space after a non-space character (``split_at_spaces``, ``word_cut``: C string methods), and
the start of every *word*, a run of whitespace and then of other characters (``words``; GPT-4
also ends a word after punctuation and its line breaks). A word always splits into the same
chunks, so ``WordCache`` encodes each distinct word, and each distinct piece between spaces
(``SpacedPieces``), once while it is in use (``RecentItems``). Special tokens are cut out of
the stream first (``special_pieces``), with ``encode``'s rules. This module does not read files.

Chapter 13 runs it: ``tinygpt prepare`` encodes a corpus larger than memory with it
(``tinygpt.prepare.workers``, ``tinygpt.prepare.documents``). No chapter displays it; chapter 1's
``BPETokenizer`` imports it for ``encode_iterable`` and ``bpe`` for cutting long runs.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import pairwise
from typing import Generic, TypeVar

import regex

HOLD = 2  # chunks kept back at the end of the buffer: what follows may still change them
MIN_CHARS = 1 << 16  # characters gathered before a cut is looked for
WORDS_KEPT = 200_000  # keys (words, pieces, chunks) in one generation of a RecentItems
CHARS_KEPT = 2_000_000  # characters of those keys in one generation of a RecentItems
LONGEST_WORD = 256  # characters of the longest word a WordCache remembers
#: Runs of whitespace, or of other characters, longer than this are cut every ``LONGEST_RUN``
#: characters from the run's start, and the pieces encoded (and counted for training) on their
#: own, as Llama 3's tokenizer does (its ``MAX_NO_WHITESPACES_CHARS``, 25,000): memory then does
#: not grow with a text without spaces (DNA, base64, one character repeated). Text with no such
#: run, all ordinary text, is not affected.
LONGEST_RUN = 25_000
UINT32 = next(code for code in "IL" if array(code).itemsize == 4)  # array's unsigned 32 bits

_SPACE_CUT = regex.compile(r"(?<=\S) ")  # a space after a non-space character
_SPACE_AFTER_SPACE = regex.compile(r"\s ")  # where text.split(" ") would cut elsewhere
_SPACE = regex.compile(r"\s")  # whitespace as the patterns' \s sees it
_SPACE_KEPT = regex.compile(r"(?<=\s) ")  # a space after whitespace: split_at_spaces keeps it
SPACES_KEPT_SPLIT = 64  # more spaces after whitespace than this: split_at_spaces by regex
# GPT-2's words in the standard library's re, 1.5x faster than regex here: its \s also takes
# \x1c-\x1f, which regex's (the patterns') does not, so they are named
_WS, _NON_WS = r"[^\S\x1c-\x1f]", r"[\S\x1c-\x1f]"
_WORDS: dict[str, re.Pattern[str] | regex.Pattern[str]] = {  # by the pattern's name
    "gpt2": re.compile(rf"{_WS}*{_NON_WS}+|{_WS}+"),
    "gpt4": regex.compile(r"\s*(?:\S*?[^\s\p{L}\p{N}][\r\n]+|\S+)|\s+"),
}


_RUNS: dict[int, regex.Pattern[str]] = {}


_NON_SPACE_BLOCK, _SPACE_BLOCK = regex.compile(r"\S+"), regex.compile(r"\s+")


def run_cuts(text: str) -> list[int]:
    """Where ``text`` is cut because of a long run: every ``LONGEST_RUN`` characters from the start
    of each run of whitespace (``\\s``), or of other characters, longer than that. A cut depends
    only on the text before it, so the text on either side of a cut is encoded on its own.

    Searching the whole text with the run pattern would try a match at every position (12 MB/s);
    instead only blocks of ``LONGEST_RUN // 2`` characters, aligned, are tried (a run that long
    covers one whole), and the pattern is searched from the block before one that is a run."""
    limit = LONGEST_RUN
    n = len(text)
    if n <= limit:
        return []
    rx = _RUNS.get(limit)
    if rx is None:
        rx = _RUNS[limit] = regex.compile(rf"\s{{{limit + 1},}}+|\S{{{limit + 1},}}+")
    step = max(1, limit // 2)
    cuts: list[int] = []
    done = 0  # the text before it has been searched
    for start in range(0, n - step + 1, step):
        if start + step <= done or not (_NON_SPACE_BLOCK.fullmatch(text, start, start + step)
                                        or _SPACE_BLOCK.fullmatch(text, start, start + step)):
            continue
        # the run holding this block starts after the previous block, which is not all one run
        # (else it would have been found from there), or where the last long run ended
        found = rx.search(text, max(done, start - step))
        if found is None or found.start() > start:
            continue  # a block of one run that is not longer than the limit
        cuts += range(found.start() + limit, found.end(), limit)
        done = found.end()
    return cuts


def run_pieces(text: str) -> list[str]:
    """``text`` cut at its ``run_cuts`` (``[text]`` when it has none)."""
    cuts = run_cuts(text)
    if not cuts:
        return [text]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in pairwise(bounds)]


def split_at_spaces(text: str) -> list[str]:
    """``text`` cut at each space that follows a non-space character, the spaces left out:
    ``pieces[0] + "".join(" " + p for p in pieces[1:]) == text``, and with GPT-2's or GPT-4's
    pattern ``pieces[0]`` and each ``" " + p`` split into the chunks ``text`` has there."""
    if _SPACE_AFTER_SPACE.search(text) is None:  # every space follows a non-space (or starts)
        return text.split(" ")  # 3x faster than the regex; a leading space gives pieces[0] ""
    kept = [found.start() for found in _SPACE_KEPT.finditer(text)]  # spaces that are no cut
    if len(kept) > SPACES_KEPT_SPLIT:
        return _SPACE_CUT.split(text)
    pieces: list[str] = []
    for start, end in pairwise([-1, *kept, len(text)]):  # split between them, join across
        part = text[start + 1:end].split(" ")
        if pieces:
            pieces[-1] += " " + part[0]
            pieces += part[1:]
        else:
            pieces = part
    return pieces


def words(text: str, pattern: str) -> list[str]:
    """``text`` as words for GPT-2's or GPT-4's pattern (``pattern``: ``"gpt2"`` or ``"gpt4"``):
    they join to ``text``, and each splits into the chunks that ``text`` has there."""
    return _WORDS[pattern].findall(text)


def word_cut(buffer: str) -> int:
    """The position of the last space of ``buffer`` that follows a non-space character (0 if
    none): ``buffer[:cut]`` and ``buffer[cut:]`` split as they do within ``buffer``."""
    cut = buffer.rfind(" ")
    while cut > 0 and _SPACE.match(buffer, cut - 1):
        cut = buffer.rfind(" ", 0, cut)
    return max(cut, 0)


Value = TypeVar("Value")


class RecentItems(dict[str, Value], Generic[Value]):
    """A cache that keeps what is in use, in bounded memory. Items are remembered in the current
    generation (this dictionary) until it holds ``WORDS_KEPT`` keys or ``CHARS_KEPT`` characters
    of keys; then it becomes the previous generation (the one before is dropped) and a new one
    starts. A key missing here but found in the previous generation is ``recall``-ed: moved back
    into the current one. So a text with more distinct words than a generation holds (text drawn
    from an n-gram model, a large corpus) keeps its frequent words, instead of encoding them
    again after the cache is emptied; and at most two generations are held."""

    def __init__(self) -> None:
        super().__init__()
        self.previous: dict[str, Value] = {}
        self.chars = 0  # characters of the current generation's keys

    def recall(self, key: str) -> Value | None:
        """The value of ``key`` from the previous generation, moved into the current one (None if
        it is not there)."""
        value = self.previous.pop(key, None)
        if value is not None:
            self.remember(key, value)
        return value

    def remember(self, key: str, value: Value) -> None:
        """Store ``key``'s value in the current generation, starting a new one when it is full."""
        if len(self) >= WORDS_KEPT or self.chars >= CHARS_KEPT:
            self.previous = {}  # the generation before is dropped first
            self.previous = dict(self)  # a new table; the keys and values are shared
            self.clear()
            self.chars = 0
        self[key] = value
        self.chars += len(key)


class SpacedPieces(RecentItems[bytes]):
    """``WordCache``'s first level: the ids (bytes of uint32) of ``" " + piece`` for each piece
    met, from the words' ids (``word_ids``, ``split``): a text's pieces between spaces repeat as
    its words do, and a lookup per piece is cheaper than a regular expression per word. A piece
    without whitespace is one word, found without the regular expression. The pieces in use are
    kept (``RecentItems``); a piece longer than ``LONGEST_WORD`` is encoded, not kept."""

    def __init__(self, word_ids: Callable[[str], bytes],
                 encode_text: Callable[[str], list[int]]) -> None:
        super().__init__()
        self.word_ids, self.encode_text = word_ids, encode_text

    def __missing__(self, piece: str) -> bytes:
        ids = self.recall(piece)
        if ids is not None:
            return ids
        spaced = " " + piece
        if len(piece.split(None, 1)) == 1:  # no whitespace (str's, a superset of \s): one word
            ids = self.word_ids(spaced)
        else:  # several words, often met only here: their chunks at once
            ids = array(UINT32, self.encode_text(spaced)).tobytes()
        if len(piece) <= LONGEST_WORD:
            self.remember(piece, ids)
        return ids


class WordCache(RecentItems[bytes]):
    """The ids of each *word* met so far (``words``), made by ``encode_text`` on first use and
    kept as the bytes of unsigned 32-bit ints, and for GPT-4's pattern (``spaced``,
    ``SpacedPieces``) those of each piece after a space, so that ``encode(text)`` (an
    ``array``) is one dictionary lookup a word or piece and one ``b"".join``: it equals
    ``encode_text(text)`` for GPT-2's and GPT-4's pattern (``pattern``: ``"gpt2"`` or
    ``"gpt4"``). The words in use are kept (``RecentItems``); one longer than ``LONGEST_WORD``
    is encoded, not kept."""

    def __init__(self, encode_text: Callable[[str], list[int]], pattern: str) -> None:
        super().__init__()
        self.encode_text, self.words = encode_text, _WORDS[pattern].findall
        self.spaced = SpacedPieces(self.__getitem__, encode_text)  # " " + piece -> ids
        # GPT-2's words come from the standard re, about as fast as cutting at spaces
        self.by_pieces = pattern != "gpt2"

    def __missing__(self, word: str) -> bytes:
        ids = self.recall(word)
        if ids is None:
            ids = array(UINT32, self.encode_text(word)).tobytes()
            if len(word) <= LONGEST_WORD:
                self.remember(word, ids)
        return ids

    def encode(self, text: str) -> array:
        """The ids of ``text``, each of its ``run_pieces`` on its own: for GPT-2's pattern word
        by word; for GPT-4's (``by_pieces``) cut at the spaces that follow a non-space
        (``split_at_spaces``), the first piece word by word and each other ``" " + piece``
        looked up whole in ``spaced`` (a piece that ends a text may end in
        whitespace, which GPT-4's ``\\s++$`` splits apart, but any other piece ends before a
        space, on a non-space, so a piece splits the same wherever it is met)."""
        get = self.__getitem__
        if not self.by_pieces:
            return array(UINT32, b"".join([b"".join(map(get, self.words(piece)))
                                           for piece in run_pieces(text)]))
        out = []
        for run_piece in run_pieces(text):
            first, *rest = split_at_spaces(run_piece)
            out.append(b"".join(map(get, self.words(first))))
            out.append(b"".join(map(self.spaced.__getitem__, rest)))
        return array(UINT32, b"".join(out))


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


def settled_cut(buffer: str, split: Callable[[str], list[str]]) -> int:
    """A settled cut of ``buffer`` for GPT-2's or GPT-4's pattern (``split``): the last space
    after a non-space character, found without splitting, or else the last ``run_cuts``, or else
    ``ready_prefix``'s if it is not inside the buffer's last run (which may yet grow past
    ``LONGEST_RUN``: a cut inside it would move the run's cuts). ``buffer`` must start where
    the text may be cut."""
    cut = word_cut(buffer)
    if cut:
        return cut
    cuts = run_cuts(buffer)
    if cuts:
        return cuts[-1]
    cut = ready_prefix(buffer, split)
    if cut and buffer:
        space = _SPACE.match(buffer, len(buffer) - 1) is not None
        last_run = len(buffer)
        while last_run > 0 and (_SPACE.match(buffer, last_run - 1) is not None) == space:
            last_run -= 1
        if cut > last_run:
            return 0
    return cut


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
        cut = settled_cut(joined, split)
        if cut:
            yield joined[:cut]
        buffer, size = [joined[cut:]], len(joined) - cut
    if size:
        yield "".join(buffer)


def special_sets(special_tokens: Mapping[str, int], allowed_special: Iterable[str] | str,
                 disallowed_special: Iterable[str] | str) -> tuple[set[str], set[str]]:
    """The special tokens to encode as their ids and those to refuse, as tiktoken reads
    ``encode``'s two arguments: each ``"all"`` or an iterable of special tokens of
    ``special_tokens``; ``disallowed_special="all"`` is every one not allowed. TypeError for a
    bare string, ValueError naming any that the tokenizer does not have."""

    def as_set(value: Iterable[str] | str, name: str) -> set[str]:
        if value == "all":
            return set(special_tokens)
        if isinstance(value, str):
            raise TypeError(f"{name} must be 'all' or a set of strings such as "
                            f"{{{value!r}}}, not the string {value!r}")
        result = set(value)
        unknown = result - set(special_tokens)
        if unknown:
            raise ValueError(f"{name} names {sorted(unknown)}, which are not special tokens "
                             f"of this tokenizer (it has {sorted(special_tokens)})")
        return result

    allowed = as_set(allowed_special, "allowed_special")
    if disallowed_special == "all":
        return allowed, set(special_tokens) - allowed
    return allowed, as_set(disallowed_special, "disallowed_special")


class StreamEncoding:
    """``encode_iterable`` for a tokenizer with ``encode_ordinary``, ``pattern``, ``pre_split``
    (its pattern's ``findall``) and ``_covers`` (whether that pattern covers every text)."""

    pattern: str | None
    pre_split: Callable[[str], list[str]] | None
    _covers: bool

    special_tokens: dict[str, int]
    encode_ordinary: Callable[[str], list[int]]

    def encode_iterable(self, texts: Iterable[str],
                        allowed_special: Iterable[str] | str = (),
                        disallowed_special: Iterable[str] | str = "all") -> Iterator[int]:
        """The ids of ``"".join(texts)``, as ``encode`` gives them with the same special-token
        rules, one by one and lazily: ``texts`` may be an open file (its lines) larger than
        memory, and a special token may be cut across two of them. A disallowed special token
        raises ValueError when the stream reaches it (the ids before it were given)."""
        if self.pre_split is None or not self._covers:
            raise ValueError("encode_iterable cuts the text between pre-split chunks, so it "
                             "needs GPT-2's or GPT-4's pattern; this tokenizer has pattern "
                             f"{self.pattern!r} (encode the whole text with encode_ordinary)")
        if isinstance(texts, str):
            raise TypeError("texts must be an iterable of strings (lines, say), not one string: "
                            "pass [text]")
        allowed, disallowed = special_sets(self.special_tokens, allowed_special,
                                           disallowed_special)
        split = self.pre_split  # not None: checked above
        if not allowed and not disallowed:
            return self._ids(texts, split)
        return self._ids_with_specials(texts, split, allowed, disallowed)

    def _ids_with_specials(self, texts: Iterable[str], split: Callable[[str], list[str]],
                           allowed: set[str], disallowed: set[str]) -> Iterator[int]:
        """``_ids`` of the text between special tokens, and each allowed one's id."""
        pieces = special_pieces(texts, allowed, disallowed)
        found: list[str | None] = []

        def ordinary() -> Iterator[str]:  # the text up to the next allowed special token
            for text, special in pieces:
                yield text
                if special is not None:
                    found.append(special)
                    return
            found.append(None)

        while True:
            yield from self._ids(ordinary(), split)
            special = found.pop()
            if special is None:
                return
            yield self.special_tokens[special]

    def _ids(self, texts: Iterable[str], split: Callable[[str], list[str]]) -> Iterator[int]:
        for part in ready_texts(texts, split, MIN_CHARS):
            yield from self.encode_ordinary(part)


def _alternation(specials: set[str]) -> regex.Pattern[str]:
    """The special tokens as one regex, longest first: a token that contains another wins."""
    return regex.compile("|".join(map(regex.escape, sorted(specials, key=len, reverse=True))))


def special_pieces(texts: Iterable[str], allowed: set[str],
                   disallowed: set[str]) -> Iterator[tuple[str, str | None]]:
    """``(text, special)``: the joined ``texts`` cut at each ``allowed`` special token, as
    ``regex.finditer`` finds them in the whole text (``special`` is None after the last text);
    ValueError at a ``disallowed`` one. The last ``longest - 1`` characters are kept back, so a
    token cut across two texts is found, and a match is taken only once every longer token
    starting where it does could be seen."""
    split = _alternation(allowed) if allowed else None
    refuse = _alternation(disallowed) if disallowed else None
    longest = max(map(len, allowed | disallowed))
    buffer, offset = "", 0  # offset: characters of the text before the buffer

    def cut(final: bool) -> Iterator[tuple[str, str | None]]:
        nonlocal buffer, offset
        bad = refuse.search(buffer) if refuse else None
        if bad:
            raise ValueError(
                f"text contains the special token {bad.group()!r} at position "
                f"{offset + bad.start()}, which is disallowed. To encode it as its special id, "
                f"pass allowed_special={{{bad.group()!r}}} (or 'all'); to encode it as "
                "ordinary text, pass disallowed_special=().")
        pos = 0
        for m in split.finditer(buffer) if split else ():
            if not final and m.start() + longest > len(buffer):
                break  # a longer token may start here: wait for more text
            yield buffer[pos:m.start()], m.group()
            pos = m.end()
        keep = len(buffer) if final else max(pos, len(buffer) - (longest - 1))
        if keep > pos or final:
            yield buffer[pos:keep], None
        buffer, offset = buffer[keep:], offset + keep

    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts must yield str, got {type(text).__name__} at item {i}")
        buffer += text
        yield from cut(final=False)
    yield from cut(final=True)
