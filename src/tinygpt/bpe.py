"""Byte-pair encoding (BPE): the algorithms behind the tokenizer of chapter 1.

Pre-splitting text with GPT-2's and GPT-4's regular expressions; counting adjacent pairs and
merging one; learning merges twice (:func:`train_merges_naive`, the textbook loop, and
:func:`train_merges`, the fast one with the same answer); and applying merges to a chunk by rank,
as GPT-2 and tiktoken do (:func:`encode_chunk`). Vocabularies, special tokens, decoding and files
belong to :mod:`tinygpt.tokenizer`.

Both trainers: a chunk is a sequence of bytes (0-255); merge ``i`` makes id ``256 + i``; each step
merges the pair with the highest count, ties going to the smallest pair ``(a, b)``.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise

import regex
from tqdm.auto import tqdm

from tinygpt.checks import check_int
from tinygpt.stream import run_pieces

Pair = tuple[int, int]

#: GPT-2's pre-split: contractions, letters, numbers, other symbols, whitespace.
GPT2_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)

#: GPT-4's (cl100k_base) pre-split: case-insensitive contractions, numbers of at most
#: three digits, and newlines kept apart from other whitespace.
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|"""
    r""" ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

#: Pattern names accepted wherever a pattern is expected; ``"none"`` means no pre-split.
PATTERNS: dict[str, str | None] = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN, "none": None}


def resolve_pattern(pattern: str | None) -> str | None:
    """A pattern name from :data:`PATTERNS`, a raw regex, or None, as a regex or None."""
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a name from {sorted(PATTERNS)}, a regex string "
                        f"or None, not {type(pattern).__name__}")
    if pattern in PATTERNS:
        return PATTERNS[pattern]
    try:
        regex.compile(pattern)
    except regex.error as err:
        raise ValueError(f"pattern {pattern!r} is neither a name from {sorted(PATTERNS)} "
                         f"nor a valid regular expression ({err})") from None
    return pattern


def split_text(text: str, pattern: str | None = "gpt4") -> list[str]:
    """Split ``text`` into the chunks BPE works on (merges never cross them) with ``pattern``,
    a name from :data:`PATTERNS`, a regex, or None (one chunk). A run of whitespace, or of other
    characters, longer than :data:`tinygpt.stream.LONGEST_RUN` is first cut every that many
    characters (``tinygpt.stream.run_cuts``), and each piece split on its own: ordinary text has
    no such run, and memory stays bounded on text without spaces."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    rx = resolve_pattern(pattern)
    if not text:
        return []
    if rx is None:
        return run_pieces(text)
    return [chunk for piece in run_pieces(text) for chunk in regex.findall(rx, piece)]


def check_covered(chunks: list[str], text: str, pattern: str | None) -> list[str]:
    """``chunks`` if they join back to ``text``; else ValueError: a pre-split pattern that
    skips characters would silently drop them from the tokens."""
    pos = 0
    for chunk in chunks:  # the matches of a pattern, in order, never overlap
        start = text.index(chunk, pos)
        if start > pos:
            break
        pos = start + len(chunk)
    else:
        if pos == len(text):
            return chunks
        start = len(text)
    raise ValueError(f"the pre-split pattern {pattern!r} does not cover the text: "
                     f"{text[pos:start][:20]!r} at position {pos} matches none of it and would "
                     "be lost; use a pattern that matches every character (e.g. end it with "
                     "|\\s+|.)")


def pair_counts(ids: Sequence[int], counts: dict[Pair, int] | None = None) -> dict[Pair, int]:
    """Count every adjacent pair in ``ids`` ([a, a, a] has (a, a) twice), adding to ``counts``
    in place when given, so that the counts of many chunks can be summed."""
    counts = {} if counts is None else counts
    for pair in pairwise(ids):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def merge(ids: Sequence[int], pair: Pair, new_id: int) -> list[int]:
    """Replace each ``pair`` in ``ids`` by ``new_id``, left to right: (a, a) in [a, a, a] gives
    [new_id, a]."""
    a, b = pair
    out: list[int] = []
    i, n = 0, len(ids)
    while i < n:
        if ids[i] == a and i + 1 < n and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _as_byte_ids(chunk: str | bytes | Iterable[int]) -> list[int]:
    """A chunk as a list of byte values; a str is encoded as UTF-8."""
    if isinstance(chunk, str):
        return list(chunk.encode("utf-8"))
    if isinstance(chunk, (bytes, bytearray)):
        return list(chunk)
    ids = list(chunk)
    for x in ids:
        if not isinstance(x, int) or not 0 <= x < 256:
            raise ValueError(f"chunks must hold byte values 0..255 (merged ids start at 256), "
                             f"found {x!r}")
    return ids


def train_merges_naive(chunks: Iterable[str | bytes | Sequence[int]],
                       num_merges: int) -> list[Pair]:
    """Learn up to ``num_merges`` merges, the textbook way: each step recounts every pair of
    every chunk and merges the most frequent one everywhere. Stops early when no pair is left."""
    check_int(num_merges, "num_merges", low=0)
    seqs = [_as_byte_ids(c) for c in chunks]
    merges: list[Pair] = []
    for i in range(num_merges):
        counts: dict[Pair, int] = {}
        for seq in seqs:
            pair_counts(seq, counts)
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))  # highest count, then smallest
        seqs = [merge(seq, best, 256 + i) for seq in seqs]
        merges.append(best)
    return merges


def _dedupe(chunks: Mapping | Iterable) -> tuple[list[list[int]], list[int]]:
    """Distinct chunks (as byte-id lists) and how often each occurs."""
    if not isinstance(chunks, Mapping):
        chunks = Counter(c if isinstance(c, (str, bytes)) else tuple(c) for c in chunks)
    words, freqs = [], []
    for chunk, count in chunks.items():
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"chunk counts must be ints >= 0, got {count!r} for {chunk!r}")
        if count:
            words.append(_as_byte_ids(chunk))
            freqs.append(count)
    return words, freqs


def train_merges(chunks: Mapping[str | bytes | tuple[int, ...], int]
                 | Iterable[str | bytes | Sequence[int]],
                 num_merges: int, progress: bool = False) -> list[Pair]:
    """The merges of :func:`train_merges_naive`, fast. ``chunks``: a list, or a mapping (a
    ``Counter``) from chunk to count. Identical chunks are stored once, with a weight; all
    symbols live in one linked list with an index from each pair to where it starts, so a
    merge touches only its own occurrences; a max-heap finds the best pair (stale entries are
    skipped when popped)."""
    check_int(num_merges, "num_merges", low=0)
    words, freqs = _dedupe(chunks)
    sym: list[int] = []  # the symbol at each position; -1 once merged into its left neighbour
    weight: list[int] = []  # the count of the chunk each position belongs to
    for word, freq in zip(words, freqs, strict=True):
        sym += word + [-1]  # a -1 after each chunk: pairs never cross chunks
        weight += [freq] * (len(word) + 1)
    n = len(sym)
    nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
    counts: dict[Pair, int] = defaultdict(int)
    where: defaultdict[Pair, list[int]] = defaultdict(list)  # may hold stale positions
    for i in range(n - 1):
        if sym[i] >= 0 and sym[i + 1] >= 0:
            counts[sym[i], sym[i + 1]] += weight[i]
            where[sym[i], sym[i + 1]].append(i)
    heap = [(-count, pair) for pair, count in counts.items()]
    heapq.heapify(heap)  # heap order is (-count, pair): highest count, then smallest pair

    merges: list[Pair] = []
    with tqdm(total=num_merges, disable=not progress, desc="BPE merges") as bar:
        while len(merges) < num_merges:
            while heap and counts.get(heap[0][1], 0) != -heap[0][0]:
                heapq.heappop(heap)  # stale: the count changed after this entry was pushed
            if not heap or heap[0][0] == 0:
                break  # no pair left to merge
            best = heapq.heappop(heap)[1]
            a, b = best
            new_id = 256 + len(merges)
            merges.append(best)
            changed: set[Pair] = set()
            for i in sorted(set(where.pop(best))):  # left to right, as merge() scans
                j = nxt[i] if i < n else n
                if sym[i] != a or j >= n or sym[j] != b:
                    continue  # stale, or the right half was taken by the occurrence before
                w, left, right = weight[i], prv[i], nxt[j]
                if left >= 0 and sym[left] >= 0:  # (left, a) becomes (left, new)
                    counts[sym[left], a] -= w
                    counts[sym[left], new_id] += w
                    where[sym[left], new_id].append(left)
                    changed |= {(sym[left], a), (sym[left], new_id)}
                if right < n and sym[right] >= 0:  # (b, right) becomes (new, right)
                    counts[b, sym[right]] -= w
                    counts[new_id, sym[right]] += w
                    where[new_id, sym[right]].append(i)
                    changed |= {(b, sym[right]), (new_id, sym[right])}
                counts[best] -= w
                sym[i], sym[j] = new_id, -2  # j is gone: unlink it
                nxt[i] = right
                if right < n:
                    prv[right] = i
            for pair in changed | {best}:
                count = counts.get(pair, 0)
                if count > 0:
                    heapq.heappush(heap, (-count, pair))
                else:
                    counts.pop(pair, None)
                    where.pop(pair, None)
            bar.update(1)
    return merges


# Pieces longer than this (in bytes) use the heap version of encode_chunk: the simple
# version is quadratic, which only matters for very long chunks (e.g. no pre-split).
_LONG_CHUNK = 512
_SINGLE_BYTES = [bytes([b]) for b in range(256)]


def encode_chunk(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """Encode one chunk by rank, as GPT-2 and tiktoken do: from single bytes, join again and
    again the two adjacent parts whose concatenation has the lowest rank (leftmost on ties);
    return the parts' ranks, the token ids. A chunk that is itself a token is that token."""
    whole = ranks.get(piece)
    if whole is not None:
        return [whole]
    if len(piece) > _LONG_CHUNK:
        return _encode_long_chunk(piece, ranks)
    parts = list(map(_SINGLE_BYTES.__getitem__, piece))  # the single bytes, as bytes
    none = len(ranks) + 1  # larger than any rank: "not mergeable"
    get = ranks.get
    # pair_rank[i] is the rank of parts[i] + parts[i + 1]
    pair_rank = [get(a + b, none) for a, b in pairwise(parts)]
    while pair_rank:
        best = min(pair_rank)
        if best == none:
            break
        i = pair_rank.index(best)  # leftmost occurrence of the lowest rank
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
        del pair_rank[i]
        if i > 0:
            pair_rank[i - 1] = get(parts[i - 1] + parts[i], none)
        if i < len(pair_rank):
            pair_rank[i] = get(parts[i] + parts[i + 1], none)
    return list(map(ranks.__getitem__, parts))


def _encode_long_chunk(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """:func:`encode_chunk` in O(n log n): parts are named by their start ``s`` and end at
    ``nxt[s]``; a heap entry ``(rank, start, end)`` joins two parts and is stale once they
    changed."""
    n = len(piece)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap = []
    for s in range(n - 1):
        r = ranks.get(piece[s:s + 2])
        if r is not None:
            heap.append((r, s, s + 2))
    heapq.heapify(heap)  # (rank, start) order: lowest rank, then leftmost
    while heap:
        _, s, end = heapq.heappop(heap)
        mid = nxt[s] if alive[s] else n
        if mid >= n or nxt[mid] != end:
            continue  # stale entry
        alive[mid] = False  # join the parts [s, mid) and [mid, end)
        nxt[s] = end
        if end < n:
            prv[end] = s
            r = ranks.get(piece[s:nxt[end]])
            if r is not None:
                heapq.heappush(heap, (r, s, nxt[end]))
        if prv[s] >= 0:
            r = ranks.get(piece[prv[s]:end])
            if r is not None:
                heapq.heappush(heap, (r, prv[s], end))
    out, s = [], 0
    while s < n:
        out.append(ranks[piece[s:nxt[s]]])
        s = nxt[s]
    return out
