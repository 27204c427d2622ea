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
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and torch are imported when used: the command line imports this
    import numpy as np  # module before torch (tinygpt.cli), and prepare's workers need no torch
    import torch
    from torch import Tensor

MANIFEST = "shards.json"
PROGRESS = ".shards-progress.json"  # the manifest of an unfinished run, updated per shard
TOKENIZER_FILE = "tokenizer.json"
FORMAT, VERSION = "tinygpt-shards", 1
SPLITS = ("train", "val")


class ShardError(ValueError):
    """A shards folder, manifest or shard that is missing, altered or not tinygpt's."""


def shard_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits in 16 bits, else ``uint32`` (little-endian)."""
    import numpy as np

    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.bin"


def is_shards_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a ``shards.json`` (finished or not checked)."""
    return (Path(folder) / MANIFEST).is_file()


def read_manifest(folder: str | Path, name: str = MANIFEST) -> dict[str, Any]:
    """The manifest ``name`` of ``folder``; ``ShardError`` if absent or not tinygpt's."""
    path = Path(folder) / name
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ShardError(f"{path}: no such file; {folder} is not a finished shards folder "
                         "(run tinygpt prepare)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ShardError(f"{path}: cannot read a shards manifest: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ShardError(f"{path} is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise ShardError(f"{path}: version {manifest.get('version')!r} is not supported")
    return manifest


def check_shard(folder: Path, entry: dict[str, Any], dtype: np.dtype,
                checksum: bool = True) -> Path:
    """The path of a shard once its size (and SHA-256) match the manifest's ``entry``."""
    path = folder / entry["file"]
    want = entry["tokens"] * dtype.itemsize
    try:
        size = path.stat().st_size
    except OSError:
        raise ShardError(f"{path}: missing; the shards folder is incomplete (run tinygpt "
                         "prepare again)") from None
    if size != want:
        raise ShardError(f"{path}: {size} bytes, the manifest says {want} ({entry['tokens']} "
                         "tokens): truncated or altered; run tinygpt prepare again")
    if checksum:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        if digest.hexdigest() != entry["sha256"]:
            raise ShardError(f"{path}: SHA-256 {digest.hexdigest()}, the manifest says "
                             f"{entry['sha256']}: altered; run tinygpt prepare again")
    return path


def load_tokenizer(folder: str | Path, manifest: dict[str, Any] | None = None) -> Any:
    """The tokenizer the shards of ``folder`` were encoded with (its file checked)."""
    from tinygpt.tokenizer import BPETokenizer, CharTokenizer

    folder = Path(folder)
    raw = (manifest or read_manifest(folder))["tokenizer"]
    if raw["type"] == "char":
        return CharTokenizer(raw["chars"])
    data = (folder / raw["file"]).read_bytes()
    if hashlib.sha256(data).hexdigest() != raw["sha256"]:
        raise ShardError(f"{folder / raw['file']}: SHA-256 differs from the manifest's: altered")
    return BPETokenizer.load(folder / raw["file"], data=data)


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
        self.arrays = [np.memmap(check_shard(self.folder, e, self.dtype, checksum),
                                 dtype=self.dtype, mode="r") for e in entries]
        self.split = split

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
        pairs = zip(which, offsets, strict=True)
        windows = np.stack([self.arrays[k][o:o + T + 1] for k, o in pairs])  # (B, T+1)
        windows = torch.from_numpy(windows.astype(np.int64))  # (B, T+1)
        return windows[:, :-1], windows[:, 1:]

    def __repr__(self) -> str:
        return (f"TokenShards({str(self.folder)!r}, {self.split!r}: {len(self.arrays)} shards, "
                f"{len(self)} tokens)")
