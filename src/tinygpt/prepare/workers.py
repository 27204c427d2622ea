"""The worker processes of ``tinygpt prepare``: encoding parts of documents, and counting words
to learn a BPE tokenizer.

``Mapper`` runs tasks in a pool of spawned processes (or in this process for one worker), a few
ahead, results in order, so the shards are the same bytes for any number of workers. Tasks are
groups of parts of about a fixed number of characters (``grouped``). ``make_tokenizer`` builds the
tokenizer a run asks for: GPT-2's, the characters of every document, or BPE learned on the
training documents' words, counted by the workers. It does not read files (``documents``) or write
shards (``tinygpt.prepare``).
"""

from __future__ import annotations

import os
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinygpt.prepare.documents import Options, parts
from tinygpt.stream import run_pieces, split_at_spaces, words
from tinygpt.tokenizer import EOT

if TYPE_CHECKING:
    import numpy as np

    from tinygpt.tokenizer import SavedTokenizer

COUNT_CHARS = 1 << 23  # characters per task when counting words for BPE
MAX_WORKERS = 1024  # more --workers than this is a mistake, whatever the machine


def cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def useful_workers(workers: int, files: list[tuple[str, Path]], task_chars: int) -> int:
    """``workers``, but no more than the cores, nor than the tasks of ``task_chars`` characters
    that the files can make (a task holds at least that many, but the last)."""
    tasks = sum(p.stat().st_size for _, p in files) // task_chars + 1
    return max(1, min(workers, cores(), tasks))


_TOKENIZER: Any = None


def init_worker(tokenizer: SavedTokenizer | None) -> None:
    """Run in each worker process once: the tokenizer its tasks use."""
    global _TOKENIZER
    _TOKENIZER = tokenizer


def encode_texts(texts: list[str]) -> list[np.ndarray]:
    """A worker's task: each text's token ids, as a ``uint32`` array."""
    import numpy as np

    tok = _TOKENIZER
    if hasattr(tok, "encode_array"):  # BPE: the ids' bytes, no Python int per id
        return [np.frombuffer(tok.encode_array(text), dtype=np.uint32) for text in texts]
    return [np.asarray(tok.encode(text), dtype=np.uint32) for text in texts]


def count_words(texts: list[str]) -> Counter:
    """How often each word (``tinygpt.stream.words``) occurs in ``texts``, for GPT-4's pattern.
    The pieces between spaces are counted first (in C), and only distinct ones cut into words,
    so that ``chunk_counts`` splits only distinct words into chunks. Runs longer than
    ``tinygpt.stream.LONGEST_RUN`` are cut first, as encoding cuts them: no word is longer than
    twice that, whatever the text."""
    counts: Counter = Counter()
    for text in (piece for t in texts for piece in run_pieces(t)):  # long runs cut: bounded words
        pieces = split_at_spaces(text)
        counts.update(words(pieces[0], "gpt4"))  # no space before the first
        for piece, n in Counter(pieces[1:]).items():
            for word in words(" " + piece, "gpt4"):
                counts[word] += n
    return counts


def grouped(items: Iterable[tuple[Any, str]], chars: int) -> Iterator[tuple[list, list[str]]]:
    """Consecutive ``(key, text)`` items as ``(keys, texts)`` of about ``chars`` characters: a
    worker's task (documents are often far smaller than a good task)."""
    keys: list = []
    texts: list[str] = []
    size = 0
    for key, text in items:
        keys.append(key)
        texts.append(text)
        size += len(text)
        if size >= chars:
            yield keys, texts
            keys, texts, size = [], [], 0
    if keys:
        yield keys, texts


def chunk_counts(words: Counter, split: Callable[[str], list[str]]) -> Counter:
    """The chunks of the counted words, each word split once and counted as often as it is."""
    chunks: Counter = Counter()
    for word, n in words.items():
        for chunk in split(word):
            chunks[chunk] += n
    return chunks


class Mapper:
    """``imap`` over ``workers`` processes (in this one for 1), order kept, a few ahead."""

    def __init__(self, workers: int, tokenizer: SavedTokenizer | None = None) -> None:
        self.pool = None
        init_worker(tokenizer)
        if workers > 1:
            import multiprocessing

            context = multiprocessing.get_context("spawn")
            self.pool = context.Pool(workers, init_worker, (tokenizer,))
        self.workers = workers

    def imap(self, fn: Callable[[Any], Any], items: Iterator[tuple[Any, Any]],
             ahead: int) -> Iterator[tuple[Any, Any]]:
        """``(key, fn(x))`` for each ``(key, x)`` of ``items``, in order, with at most ``ahead``
        of them at the workers: this process reads on while they encode."""
        if self.pool is None:
            yield from ((key, fn(x)) for key, x in items)
            return
        pending: deque = deque()
        for key, x in items:
            pending.append((key, self.pool.apply_async(fn, (x,))))
            if len(pending) >= ahead:
                key, result = pending.popleft()
                yield key, result.get()
        while pending:
            key, result = pending.popleft()
            yield key, result.get()

    def close(self) -> None:
        if self.pool:
            self.pool.terminate()


def make_tokenizer(files: list[tuple[str, Path]], options: Options, workers: int,
                   sizes: Mapping[Path, int] | None = None) -> Any:
    """The tokenizer of ``options``: GPT-2's, the characters of every document, or BPE learned on
    the training documents' pre-split chunks (counted by the workers, then merged); each file
    read up to its ``sizes`` bytes (``documents.parts``)."""
    from tinygpt.bpe import GPT4_PATTERN, train_merges
    from tinygpt.tokenizer import BPETokenizer, CharTokenizer

    if options.tokenizer == "gpt2":
        from tinygpt.gpt2 import load_tokenizer, tokenizer_files

        return load_tokenizer(*tokenizer_files())
    if options.tokenizer == "char":
        chars: set[str] = set()
        for _, text, _ in parts(files, None, options, sizes=sizes):
            chars.update(text)
        return CharTokenizer(sorted(chars))
    import regex

    split = regex.compile(GPT4_PATTERN).findall
    mapper, counts = Mapper(useful_workers(workers, files, COUNT_CHARS)), Counter[str]()
    try:
        train = ((None, text) for name, text, _ in parts(files, split, options, COUNT_CHARS, sizes)
                 if name == "train")
        for _, counted in mapper.imap(count_words, grouped(train, COUNT_CHARS), workers + 1):
            counts.update(counted)
    finally:
        mapper.close()
    chunks = chunk_counts(counts, split)
    merges = train_merges(chunks, max(0, options.vocab_size - 257))
    tokens = [bytes([b]) for b in range(256)]
    for a, b in merges:
        tokens.append(tokens[a] + tokens[b])
    return BPETokenizer(tokens + [EOT.encode()], merges, "gpt4", {EOT: len(tokens)})
