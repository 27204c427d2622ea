"""The documents of ``tinygpt prepare``: which input files, cut into which parts, in which split.

A file is a document, and so is each ``<|endoftext|>``-separated part of one. Each document goes
to the validation split when a seeded hash of its name (file, number) falls below
``val_fraction``, else to training; BPE documents end with the ``<|endoftext|>`` token. Files are
read in chunks and each document cut into parts at settled pre-split boundaries
(``tinygpt.stream.settled_cut``), so memory stays bounded by the part size whatever the corpus.
It does not tokenize (``tinygpt.prepare.workers``) or write anything (``tinygpt.prepare``).
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinygpt import shards as S
from tinygpt.stream import settled_cut
from tinygpt.tokenizer import EOT

PART_CHARS = 1 << 18  # characters per part, and per task of encoding sent to a worker
READ_CHARS = 1 << 20  # characters read from a file at a time


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


class Prefix(io.RawIOBase):
    """The first ``size`` bytes of the binary file ``raw``: what a file held when a run began,
    however it grows while it is read."""

    def __init__(self, raw: io.BufferedIOBase, size: int) -> None:
        super().__init__()
        self.raw, self.left = raw, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left)
        if n <= 0:
            return 0
        got = self.raw.readinto(memoryview(buffer).cast("B")[:n])
        self.left -= got or 0
        return got or 0


def open_prefix(path: Path, size: int | None) -> io.TextIOWrapper:
    """``path`` opened as UTF-8 text, line ends kept, ending after its first ``size`` bytes
    (``None``: its end)."""
    raw = open(path, "rb")  # noqa: SIM115 -- closed with the wrapper
    limited = raw if size is None else Prefix(raw, size)
    return io.TextIOWrapper(io.BufferedReader(limited), encoding="utf-8",
                            newline="")


def doc_pieces(path: Path, size: int | None = None) -> Iterator[tuple[int, str, bool]]:
    """``(document number, text, last piece of the document)`` of a file (its first ``size``
    bytes, if given), read in chunks."""
    keep = len(EOT) - 1  # a separator may straddle two chunks
    index, carry = 0, ""
    with open_prefix(path, size) as f:
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
          options: Options, part_chars: int = PART_CHARS,
          sizes: Mapping[Path, int] | None = None) -> Iterator[tuple[str, str, bool]]:
    """``(split, text, ends a document)``: every non-empty document, cut into parts of about
    ``part_chars`` that encode on their own as within the whole document. ``sizes``: the bytes
    of each file to read (those it held when the run began; default: to its end)."""
    for name, path in files:
        buffer, size, started = [], 0, False
        for index, text, last in doc_pieces(path, None if sizes is None else sizes[path]):
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


def find_inputs(spec: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """``(name, path)`` of each input file, sorted: a file, a folder's files (recursively, hidden
    ones left out) or a glob's matches."""
    import glob

    path = Path(spec).expanduser()
    if path.is_file():
        return [(path.name, path)]
    if path.exists() and not path.is_dir():  # /dev/zero, a FIFO, a socket: not "no such file"
        import stat

        mode = path.stat().st_mode
        kind = ("a character device" if stat.S_ISCHR(mode) else "a block device"
                if stat.S_ISBLK(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise ValueError(f"{spec}: is {kind}, not a text file; prepare reads regular files "
                         "(copy the text into a file first)")
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
