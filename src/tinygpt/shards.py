"""Token shards on disk: the folder ``tinygpt prepare`` writes and ``tinygpt train`` reads.

A shards folder holds raw token files (``train_000000.bin``, ``val_000000.bin``...: the ids as
little-endian ``uint16`` when the vocabulary fits, else ``uint32``; ``np.memmap`` reads them),
the tokenizer (``tokenizer.json`` for BPE, as ``BPETokenizer.save`` writes it; a char
tokenizer's characters in the manifest) and the manifest ``shards.json``, written last: token
counts and a SHA-256 per shard. ``TokenShards`` memory-maps one split's shards and draws
training windows from them as ``tinygpt.train.get_batch`` does from a tensor: a window never
crosses a shard boundary, and with one shard the windows are the tensor's, for the same
generator. It does not tokenize or write shards (``tinygpt.prepare``).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tinygpt.files.manifest import parse_manifest, tokenizer_entry_problem, tokenizer_from_entry
from tinygpt.files.reading import MAX_JSON, open_regular

if TYPE_CHECKING:  # numpy and torch are imported when used: the command line imports this
    import numpy as np  # module before torch (tinygpt.cli), and prepare's workers need no torch
    import torch
    from torch import Tensor

    from tinygpt.tokenizer import SavedTokenizer

MANIFEST = "shards.json"
PROGRESS = ".shards-progress.json"  # the manifest of an unfinished run (ProgressSaver)
FORMAT, VERSION = "tinygpt-shards", 1
SPLITS = ("train", "val")
# The names shard_name gives, and only those (a shard past the millionth has 7 digits or more)
SHARD_NAME = re.compile(r"(?:train|val)_[0-9]{6,}\.bin")


class ShardError(ValueError):
    """A shards folder, manifest or shard that is missing, altered or not tinygpt's."""


class MissingShardFile(ShardError):
    """A file the shards folder should hold is not there."""


def shard_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits in 16 bits, else ``uint32`` (little-endian)."""
    import numpy as np

    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.bin"


def is_shards_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a ``shards.json`` (finished or not checked)."""
    return (Path(folder) / MANIFEST).is_file()


def open_shards_file(path: Path, max_size: int | None = None) -> IO[bytes]:
    """``path`` opened for reading (a file object named after ``path``, as ``np.memmap`` wants),
    if it is a regular file (never through a symbolic link, and a FIFO or device is refused
    without reading) of at most ``max_size`` bytes; ``ShardError`` naming it otherwise."""
    fd = open_regular(path, error=ShardError, missing=MissingShardFile, follow_links=False,
                      max_size=max_size, holds="a shards folder holds tinygpt's files only")
    return open(path, "rb", opener=lambda *_: fd)  # the caller closes it


def _named(folder: Path, entry: dict[str, Any], key: str, allowed: re.Pattern[str] | str,
           where: str) -> Path:
    """``folder / entry[key]``, if the manifest names one of tinygpt's files by a plain name."""
    name = entry.get(key) if isinstance(entry, dict) else None
    if not isinstance(name, str) or not (name == allowed if isinstance(allowed, str)
                                         else allowed.fullmatch(name) is not None):
        raise ShardError(f"{folder / where}: names the file {name!r}, not one of the names "
                         "tinygpt prepare writes inside the folder; the manifest is altered")
    return folder / name


def read_manifest(folder: str | Path, name: str = MANIFEST) -> dict[str, Any]:
    """The manifest ``name`` of ``folder`` (``shards.json``, or ``.shards-progress.json``, that of
    an unfinished run), checked as every manifest is (``tinygpt.files.manifest.parse_manifest``:
    format, version, checksum) and for a shards manifest's entries; ``ShardError`` naming it if
    it is absent or not tinygpt's."""
    path = Path(folder) / name
    try:
        with open_shards_file(path, MAX_JSON) as f:
            raw = f.read()
    except MissingShardFile:
        what = ("is not a finished shards folder (run tinygpt prepare)" if name == MANIFEST
                else "holds no unfinished run of tinygpt prepare")
        raise ShardError(f"{path}: no such file; {folder} {what}") from None
    except OSError as err:
        raise ShardError(f"{path}: cannot read it ({err.strerror or err})") from None
    manifest = parse_manifest(raw, path, FORMAT, VERSION, ShardError, "run tinygpt prepare again")
    # What every manifest shares is checked; what follows is a shards manifest's own: the dtype
    # its vocabulary needs, and the shape of each entry (_invalid)
    vocab, dtype = manifest.get("vocab_size"), manifest.get("dtype")
    if type(vocab) is not int or vocab < 1 or dtype != shard_dtype(vocab).str:
        raise ShardError(f"{path}: dtype {dtype!r} for vocab_size {vocab!r}; tinygpt writes "
                         "'<u2' for a vocabulary of up to 65536 tokens, else '<u4'")
    problem = _invalid(manifest, name)
    if problem:
        raise ShardError(f"{path}: invalid content ({problem}); run tinygpt prepare again")
    return manifest


def _invalid(manifest: dict[str, Any], name: str) -> str | None:
    """What is missing or of the wrong type in a manifest (``name``), or None."""

    def kind(value: Any, *types: type) -> bool:  # bool is no int here
        return type(value) in types

    tok: Any = manifest.get("tokenizer")  # Any: checked before use
    problem = tokenizer_entry_problem(tok)
    if problem is not None:
        return problem
    if tok["type"] == "bpe" and not kind(tok.get("sha256"), str):
        return "its bpe tokenizer has no 'sha256' of its file"
    if "eot" not in manifest or not kind(manifest["eot"], int, type(None)):
        return "'eot' is not an id or null"
    shards: Any = manifest.get("shards")
    if not kind(shards, dict) or not all(kind(shards.get(s), list) for s in SPLITS):
        return f"'shards' has no list for each of {SPLITS}"
    for split in SPLITS:
        for e in shards[split]:
            if not (kind(e, dict) and kind(e.get("file"), str) and kind(e.get("tokens"), int)
                    and e["tokens"] >= 0 and kind(e.get("sha256"), str)):
                return f"a {split} shard without 'file', 'tokens' and 'sha256'"
    counts = ("resume",) if name == PROGRESS else ("tokens", "documents")
    for key in counts:
        value: Any = manifest.get(key)
        if not kind(value, dict) or not all(kind(value.get(s), list if key == "resume" else int)
                                            for s in SPLITS):
            return f"no {key!r} for each of {SPLITS}"
    if name == PROGRESS and not all(len(v) == 2 and all(kind(x, int) for x in v)
                                    for v in manifest["resume"].values()):
        return "'resume' is not two numbers per split"
    return None


def open_shard(folder: Path, entry: dict[str, Any], dtype: np.dtype,
               checksum: bool = True, vocab_size: int | None = None,
               name: str = MANIFEST) -> IO[bytes]:
    """A shard, open, once its name is a shard's, it is a regular file and its size (and
    SHA-256) match the ``entry`` of the manifest ``name``; with ``vocab_size``, once every id is
    below it (checked in the same pass as the SHA-256, or in a pass of its own without
    ``checksum``). Errors name the manifest: ``shards.json``, or an unfinished run's."""
    import numpy as np

    path = _named(folder, entry, "file", SHARD_NAME, name)
    want = entry["tokens"] * dtype.itemsize
    f = open_shards_file(path)
    try:
        size = os.fstat(f.fileno()).st_size
        if size != want:
            raise ShardError(f"{path}: {size} bytes, {name} says {want} ({entry['tokens']} "
                             "tokens): truncated or altered; run tinygpt prepare again")
        digest, top = hashlib.sha256(), -1
        if checksum or vocab_size is not None:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
                if vocab_size is not None:
                    top = max(top, int(np.frombuffer(block, dtype=dtype).max()))
            f.seek(0)
        if checksum and digest.hexdigest() != entry["sha256"]:
            raise ShardError(f"{path}: SHA-256 {digest.hexdigest()}, {name} says "
                             f"{entry['sha256']}: altered; run tinygpt prepare again")
        if vocab_size is not None and top >= vocab_size:
            raise ShardError(f"{path}: holds token id {top}, outside the vocabulary of "
                             f"{vocab_size} tokens that {name} gives; run tinygpt prepare "
                             "again")
    except BaseException:
        f.close()
        raise
    return f


def check_shard(folder: Path, entry: dict[str, Any], dtype: np.dtype,
                checksum: bool = True, name: str = MANIFEST) -> Path:
    """The path of a shard once its size (and SHA-256) match the ``entry`` of the manifest
    ``name`` (``shards.json``, or an unfinished run's: errors name it)."""
    with open_shard(folder, entry, dtype, checksum, name=name):
        return folder / entry["file"]


def load_shards_tokenizer(folder: str | Path, manifest: dict[str, Any] | None = None,
                          name: str = MANIFEST) -> SavedTokenizer:
    """The tokenizer the shards of ``folder`` were encoded with (its file checked), as the
    manifest ``name`` gives it: ``shards.json``, or ``.shards-progress.json`` for an unfinished
    run. ``manifest``: that file's content, if read already (``read_manifest(folder, name)``).
    Every error names the file it read: the manifest ``name`` or the tokenizer's file."""
    folder = Path(folder)
    manifest = manifest or read_manifest(folder, name)
    where = folder / name
    entry = manifest["tokenizer"]

    def checked(file: str) -> bytes:  # the file the entry names, by the SHA-256 it gives
        path = folder / file
        with open_shards_file(path, MAX_JSON) as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise ShardError(f"{path}: SHA-256 differs from the one {where} gives: altered; run "
                             "tinygpt prepare again")
        return data

    tokenizer = tokenizer_from_entry(entry, where, folder, checked, error=ShardError)
    if tokenizer.vocab_size != manifest["vocab_size"]:
        raise ShardError(f"{where}: vocab_size {manifest['vocab_size']}, but its tokenizer has "
                         f"{tokenizer.vocab_size} tokens: altered; run tinygpt prepare again")
    return tokenizer


class TokenShards:
    """One split of a shards folder, memory-mapped: a token stream cut into shards."""

    def __init__(self, folder: str | Path, split: str = "train", checksum: bool = True) -> None:
        import numpy as np

        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.folder = Path(folder)
        manifest = read_manifest(self.folder)
        self.dtype = np.dtype(manifest["dtype"])
        self.vocab_size: int = manifest["vocab_size"]
        entries = manifest["shards"][split]
        # np.memmap maps the file: pages are read when a window touches them, never all at once
        self.arrays = []
        self._files: list[tuple[str, int, int]] = []  # (path, inode, bytes) of each mapped shard
        for e in entries:
            with open_shard(self.folder, e, self.dtype, checksum,  # the file checked
                            self.vocab_size if checksum or split == "val" else None) as f:
                self.arrays.append(np.memmap(f, dtype=self.dtype, mode="r") if e["tokens"]
                                   else np.zeros(0, self.dtype))
                self._files.append((str(self.folder / e["file"]), os.fstat(f.fileno()).st_ino,
                                    e["tokens"] * self.dtype.itemsize))
        self.split = split

    def _check_unchanged(self, shards: Iterable[int]) -> None:
        """ShardError if one of these mapped shards was truncated since it was opened: reading
        past the end of a mapped file kills the process with SIGBUS, without a word."""
        for k in shards:
            path, inode, want = self._files[k]
            try:
                st = os.stat(path)
            except OSError as err:
                raise ShardError(f"{path}: a shard in use was removed ({err.strerror}): the "
                                 "shards changed during training; run tinygpt prepare again "
                                 "into a new folder, then resume") from None
            if st.st_ino == inode and st.st_size < want:  # replaced by a new file: still mapped
                raise ShardError(f"{path}: truncated to {st.st_size} bytes while in use (the "
                                 f"manifest says {want}): the shards changed during training; "
                                 "run tinygpt prepare again into a new folder, then resume")

    def __len__(self) -> int:
        return sum(len(a) for a in self.arrays)

    def starts(self, block_size: int) -> np.ndarray:
        """How many windows of ``block_size + 1`` tokens start in each shard."""
        import numpy as np

        return np.array([max(0, len(a) - block_size) for a in self.arrays], dtype=np.int64)

    def check(self, name: str, block_size: int, vocab_size: int) -> TokenShards:
        """``self``, once one window fits and the shards' vocabulary fits the model's."""
        if self.vocab_size > vocab_size:
            raise ValueError(f"{name}: the shards in {self.folder} were encoded with "
                             f"{self.vocab_size} tokens, the model has vocab_size={vocab_size}")
        if self.starts(block_size).sum() == 0:
            raise ValueError(f"{name}: no {self.split} shard in {self.folder} holds a window of "
                             f"block_size + 1 = {block_size + 1} tokens; use a smaller "
                             "block_size or more text")
        return self

    def get_batch(self, batch_size: int, block_size: int,
                  generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``batch_size`` windows ``(x, y)``, each ``(B, T)``: offsets drawn uniformly over
        every window start of every shard, as ``get_batch`` draws them from one tensor."""
        import numpy as np
        import torch

        T = block_size
        counts = self.starts(T)  # (K,) window starts in each of the K shards
        ends = np.cumsum(counts)  # (K,) window starts in shards 0..k, all together
        ix = torch.randint(int(ends[-1]), (batch_size,), generator=generator).numpy()  # (B,)
        which = np.searchsorted(ends, ix, side="right")  # (B,) the shard of each window
        offsets = ix - (ends[which] - counts[which])  # (B,) the start within that shard
        self._check_unchanged(set(which.tolist()))
        pairs = zip(which, offsets, strict=True)
        windows = np.stack([self.arrays[k][o:o + T + 1] for k, o in pairs])  # (B, T+1)
        batch = torch.from_numpy(windows.astype(np.int64))  # (B, T+1)
        return batch[:, :-1], batch[:, 1:]

    def __repr__(self) -> str:
        return (f"TokenShards({str(self.folder)!r}, {self.split!r}: {len(self.arrays)} shards, "
                f"{len(self)} tokens)")
