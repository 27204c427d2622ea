"""``tinygpt prepare``: text files to a tokenizer and token shards (``tinygpt.shards``).

A file is a document, and so is each ``<|endoftext|>``-separated part of one. Each document
goes to the validation split when a seeded hash of its name (file, number) falls below
``val_fraction``, else to training; BPE documents end with the ``<|endoftext|>`` token. Files are
read in chunks and each document cut into parts at settled pre-split boundaries
(``tinygpt.stream.settled_cut``), so memory stays bounded by the part size, a batch of parts
and one shard, whatever the corpus. Worker processes encode the parts, in order: the shards are
the same bytes for any number of workers. Each shard is written to a temporary name and renamed;
after each, ``.shards-progress.json`` records it and where in the input it ended, so a re-run
after a kill skips the finished shards; ``shards.json`` is written last. It does not read
shards (``tinygpt.shards``) or parse the command line (``tinygpt.cli_prepare``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from tinygpt import shards as S
from tinygpt.ckptio import LOCK_FILE
from tinygpt.data import write_atomically
from tinygpt.stream import settled_cut, split_at_spaces, words

EOT = "<|endoftext|>"
PART_CHARS = 1 << 18  # characters per part, and per task of encoding sent to a worker
READ_CHARS = 1 << 20  # characters read from a file at a time
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


@dataclass(frozen=True)
class Options:
    """What ``prepare`` makes: the tokenizer (``char``, ``bpe`` of ``vocab_size`` or ``gpt2``),
    the split's ``val_fraction`` and ``seed``, and ``shard_tokens`` tokens per shard."""

    tokenizer: str = "bpe"
    vocab_size: int = 512
    val_fraction: float = 0.1
    seed: int = 1337
    shard_tokens: int = 100_000_000


def is_val(name: str, index: int, options: Options) -> bool:
    """Whether document ``index`` of file ``name`` is held out: a seeded hash below the fraction."""
    h = hashlib.sha256(f"{options.seed}:{name}:{index}".encode()).digest()
    return int.from_bytes(h[:8], "little") / 2**64 < options.val_fraction


def doc_pieces(path: Path) -> Iterator[tuple[int, str, bool]]:
    """``(document number, text, last piece of the document)`` of a file, read in chunks."""
    keep = len(EOT) - 1  # a separator may straddle two chunks
    index, carry = 0, ""
    with open(path, encoding="utf-8", newline="") as f:
        while chunk := f.read(READ_CHARS):
            *done, carry = (carry + chunk).split(EOT)
            for text in done:
                yield index, text, True
                index += 1
            held = next((k for k in range(min(keep, len(carry)), 0, -1)
                         if EOT.startswith(carry[-k:])), 0)
            if len(carry) > held:
                yield index, carry[:len(carry) - held], False
                carry = carry[len(carry) - held:]
    yield index, carry, True


def parts(files: list[tuple[str, Path]], split_fn: Callable[[str], list[str]] | None,
          options: Options, part_chars: int = PART_CHARS) -> Iterator[tuple[str, str, bool]]:
    """``(split, text, ends a document)``: every non-empty document, cut into parts of about
    ``part_chars`` that encode on their own as within the whole document."""
    for name, path in files:
        buffer, size, started = [], 0, False
        for index, text, last in doc_pieces(path):
            buffer.append(text)
            size += len(text)
            if size < part_chars and not last:
                continue
            joined = "".join(buffer)
            split = "val" if is_val(name, index, options) else "train"
            cut = len(joined) if last or split_fn is None else settled_cut(joined, split_fn)
            if cut or (last and started):  # an empty document is left out
                yield split, joined[:cut], last
            started = not last and (started or cut > 0)
            buffer, size = [joined[cut:]], len(joined) - cut


# --- the worker processes ----------------------------------------------------------------------

_TOKENIZER: Any = None


def _init(tokenizer: Any) -> None:
    global _TOKENIZER
    _TOKENIZER = tokenizer


def _encode(texts: list[str]) -> list[np.ndarray]:
    import numpy as np

    tok = _TOKENIZER
    if hasattr(tok, "encode_array"):  # BPE: the ids' bytes, no Python int per id
        return [np.frombuffer(tok.encode_array(text), dtype=np.uint32) for text in texts]
    return [np.asarray(tok.encode(text), dtype=np.uint32) for text in texts]


def _count(texts: list[str]) -> Counter:
    """How often each word (``tinygpt.stream.words``) occurs in ``texts``, for GPT-4's pattern.
    The pieces between spaces are counted first (in C), and only distinct ones cut into words,
    so that ``chunk_counts`` splits only distinct words into chunks."""
    counts: Counter = Counter()
    for text in texts:
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

    def __init__(self, workers: int, tokenizer: Any = None) -> None:
        self.pool = None
        _init(tokenizer)
        if workers > 1:
            import multiprocessing

            self.pool = multiprocessing.get_context("spawn").Pool(workers, _init, (tokenizer,))
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


# --- the tokenizer -----------------------------------------------------------------------------

def make_tokenizer(files: list[tuple[str, Path]], options: Options, workers: int) -> Any:
    """The tokenizer of ``options``: GPT-2's, the characters of every document, or BPE learned on
    the training documents' pre-split chunks (counted by the workers, then merged)."""
    from tinygpt.bpe import resolve_pattern, train_merges
    from tinygpt.tokenizer import BPETokenizer, CharTokenizer

    if options.tokenizer == "gpt2":
        from tinygpt.gpt2 import load_tokenizer, tokenizer_files

        return load_tokenizer(*tokenizer_files())
    if options.tokenizer == "char":
        chars: set[str] = set()
        for _, text, _ in parts(files, None, options):
            chars.update(text)
        return CharTokenizer(sorted(chars))
    import regex

    split = regex.compile(resolve_pattern("gpt4")).findall
    mapper, counts = Mapper(useful_workers(workers, files, COUNT_CHARS)), Counter()
    try:
        train = ((None, text) for name, text, _ in parts(files, split, options, COUNT_CHARS)
                 if name == "train")
        for _, counted in mapper.imap(_count, grouped(train, COUNT_CHARS), workers + 1):
            counts.update(counted)
    finally:
        mapper.close()
    chunks = chunk_counts(counts, split)
    merges = train_merges(chunks, max(0, options.vocab_size - 257))
    tokens = [bytes([b]) for b in range(256)]
    for a, b in merges:
        tokens.append(tokens[a] + tokens[b])
    return BPETokenizer(tokens + [EOT.encode()], merges, "gpt4", {EOT: len(tokens)})


def tokenizer_entry(tokenizer: Any, out: Path) -> dict[str, Any]:
    """The manifest's ``tokenizer``: a char tokenizer's characters, or BPE's saved file."""
    from tinygpt.tokenizer import CharTokenizer

    if isinstance(tokenizer, CharTokenizer):
        return {"type": "char", "chars": tokenizer.chars}
    tmp = out / f".{S.TOKENIZER_FILE}.part"
    tokenizer.save(tmp)  # also writes .tokenizer.json.vocab, renamed below
    data = tmp.read_bytes()
    os.replace(tmp.with_suffix(".vocab"), out / Path(S.TOKENIZER_FILE).with_suffix(".vocab"))
    write_atomically(data, out / S.TOKENIZER_FILE)
    tmp.unlink()
    return {"type": "bpe", "file": S.TOKENIZER_FILE, "sha256": hashlib.sha256(data).hexdigest()}


def fingerprint(files: list[tuple[str, Path]], options: Options) -> dict[str, Any]:
    """What a re-run must find unchanged to reuse a run's shards: options, files' sizes and
    modification times."""
    stats = [(name, p.stat()) for name, p in files]
    return {"options": asdict(options),
            "inputs": [[n, s.st_size, s.st_mtime_ns] for n, s in stats]}


def save_json(out: Path, name: str, manifest: dict[str, Any]) -> None:
    """Write a manifest with the checksum of its content (``tinygpt.shards.read_manifest``)."""
    checked = {**manifest, "checksum": S.manifest_checksum(manifest)}
    write_atomically(json.dumps(checked, indent=1).encode(), out / name)


# --- inputs, output folder, and the run --------------------------------------------------------

def find_inputs(spec: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """``(name, path)`` of each input file, sorted: a file, a folder's files (recursively, hidden
    ones left out) or a glob's matches."""
    import glob

    path = Path(spec).expanduser()
    if path.is_file():
        return [(path.name, path)]
    if path.is_dir():
        found = [(p.relative_to(path).as_posix(), p) for p in sorted(path.rglob("*"))
                 if p.is_file() and not any(s.startswith(".") for s in p.relative_to(path).parts)]
    else:
        found = [(m, Path(m)) for m in sorted(glob.glob(os.fspath(path), recursive=True))
                 if Path(m).is_file()]
    shards = sorted({p.parent for _, p in found if _is_shards(p.parent)})
    if shards and len(shards) == len({p.parent for _, p in found}):
        raise ValueError(f"{spec}: holds only tinygpt shards folders ({shards[0]}), "
                         "prepare's output, not text: give the text files it was prepared from")
    for folder in shards:  # prepare's own output is never read as text
        print(f"tinygpt: note: skipping {folder}: a tinygpt shards folder ({S.MANIFEST} or "
              f"{S.PROGRESS}), not text", file=sys.stderr)
    found = [(name, p) for name, p in found if p.parent not in shards]
    if not found:
        raise ValueError(f"{spec}: no such file, no file in that folder, or no file matches that "
                         "pattern; prepare takes a text file, a folder of them or a glob")
    return found


def _is_shards(folder: Path) -> bool:
    """Whether ``folder`` is (or was being made) a shards folder: prepare's output."""
    return (folder / S.MANIFEST).is_file() or (folder / S.PROGRESS).is_file()


def own_file(name: str) -> bool:
    """Whether ``name`` is one that prepare writes (only those are ever replaced)."""
    import re

    return name in (S.MANIFEST, S.PROGRESS, S.TOKENIZER_FILE, "tokenizer.vocab",
                    LOCK_FILE) or is_leftover(name) or bool(
        re.fullmatch(r"(train|val)_\d{6}\.bin", name))


def is_leftover(name: str) -> bool:
    """Whether ``name`` is a temporary file of prepare's (a killed run leaves them)."""
    import re

    return name == f".{S.TOKENIZER_FILE}.vocab" or re.fullmatch(r"\..+\.part", name) is not None


def check_out(out: Path, files: list[tuple[str, Path]]) -> Path:
    """``out`` if prepare may write there: new, empty, or a shards folder (its own files only)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; prepare writes a folder and never replaces it")
    if any(out.resolve() in p.resolve().parents for _, p in files):
        raise ValueError(f"--out {out} holds input files: choose a folder of its own")
    if out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir()):  # the lock: prepare's
        others = sorted(p.name for p in out.iterdir() if not own_file(p.name))
        ours = (out / S.MANIFEST).is_file() or (out / S.PROGRESS).is_file()
        if others or not ours:
            shown = ", ".join((others or sorted(p.name for p in out.iterdir()))[:3])
            raise ValueError(f"--out {out} is not empty ({shown}...) and is not a tinygpt shards "
                             "folder: choose a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a read-only disk, a file on the way (--out notes.txt/sub)...
        raise ValueError(f"--out {out}: cannot create it ({err.strerror or err}"
                         f"{': ' + str(err.filename) if err.filename else ''}); nothing was "
                         "written") from None
    return out
