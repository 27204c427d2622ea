"""The manifest of a checkpoint or a shards folder: JSON that names the folder's files, checked
before any of them is read, and the tokenizer entry both kinds of folder write in it.

Every manifest is an object with a ``format`` (``"tinygpt-checkpoint"``, ``"tinygpt-shards"``), a
``version`` and a ``checksum``: the SHA-256 of its own content (``manifest_checksum``), so that an
edited or damaged manifest is refused (``parse_manifest``) instead of used. What else a manifest
holds is its folder's own (``tinygpt.checkpoint``, ``tinygpt.shards``), but for the tokenizer:
``tokenizer_entry`` writes it (a character tokenizer inline, a BPE tokenizer as the file
``tokenizer.json``), ``tokenizer_entry_problem`` checks its shape and ``tokenizer_from_entry``
reads it back, for both kinds of folder at once.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from tinygpt.tokenizer import BPETokenizer, CharTokenizer, SavedTokenizer

# Where a checkpoint or a shards folder keeps a BPE tokenizer: the model file and its token list.
TOKENIZER_FILE, TOKENIZER_VOCAB_FILE = "tokenizer.json", "tokenizer.vocab"


def manifest_checksum(manifest: dict[str, Any]) -> str:
    """The SHA-256 a manifest (a checkpoint's, a shards folder's) carries of its own content:
    its JSON with sorted keys and no spaces, without the ``checksum`` entry itself. An edited or
    damaged manifest is caught before it is used. ValueError or RecursionError if the content
    cannot be written as JSON again (nested too deeply, say)."""
    content = {k: v for k, v in manifest.items() if k != "checksum"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def parse_manifest(raw: bytes, path: str | os.PathLike[str], file_format: str, version: int,
                   error: type[ValueError], remedy: str) -> dict[str, Any]:
    """The content of a manifest (a checkpoint's, a shards folder's or an unfinished prepare
    run's) from its file's bytes ``raw``, without its ``checksum`` entry, once it is checked as
    every such manifest is: UTF-8 JSON, an object of format ``file_format`` and of ``version``,
    carrying the checksum :func:`manifest_checksum` gives of its content. Reading the file
    (regular, of bounded size: ``tinygpt.files.reading``) is the caller's, who knows its
    folder's files.

    Each problem raises ``error`` (the manifest's own: ``CheckpointError``, ``ShardError``)
    naming ``path`` and ending with ``remedy`` (what to do: "run tinygpt prepare again")."""
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


def tokenizer_entry(tokenizer: SavedTokenizer, folder: str | Path) -> dict[str, Any]:
    """The ``"tokenizer"`` entry of a checkpoint's or a shards folder's manifest: a
    ``CharTokenizer`` as ``{"type": "char", "chars": [...]}``; a ``BPETokenizer`` as ``{"type":
    "bpe", "file": "tokenizer.json"}``, once it is saved in ``folder`` (``tokenizer.json`` and
    ``tokenizer.vocab``, :meth:`BPETokenizer.save`, each written whole and flushed to the disk).

    Call it before the manifest that names the files. How the file is checked is the
    manifest's: a checkpoint lists the SHA-256 of every file, a shards manifest adds ``"sha256"``
    to this entry."""
    if isinstance(tokenizer, CharTokenizer):
        return {"type": "char", "chars": tokenizer.chars}
    if not isinstance(tokenizer, BPETokenizer):
        raise TypeError("tokenizer must be a CharTokenizer or a BPETokenizer, got "
                        f"{type(tokenizer).__name__}")
    tokenizer.save(Path(folder) / TOKENIZER_FILE)  # and tokenizer.vocab beside it
    return {"type": "bpe", "file": TOKENIZER_FILE}


def tokenizer_entry_problem(entry: object) -> str | None:
    """What makes ``entry`` unlike every ``"tokenizer"`` entry :func:`tokenizer_entry` writes
    (its shape: an object, a known type, a char entry's list of characters, a BPE entry's file
    name), or None. A manifest can check it when it is read, before any file is."""
    if entry is None:
        return "it has no tokenizer entry"
    if not isinstance(entry, dict):
        return f"its tokenizer entry is {type(entry).__name__}, not an object"
    kind = entry.get("type")
    if kind == "char":
        chars = entry.get("chars")
        if not (isinstance(chars, list) and all(isinstance(c, str) for c in chars)):
            return "its char tokenizer has no list of characters ('chars')"
        return None
    if kind == "bpe":
        if entry.get("file") != TOKENIZER_FILE:
            return (f"its tokenizer names the file {entry.get('file')!r}, not "
                    f"{TOKENIZER_FILE!r}, the one tinygpt writes")
        return None
    return f"unknown tokenizer type {kind!r} (tinygpt writes 'char' or 'bpe')"


def tokenizer_from_entry(entry: object, where: str | Path, folder: str | Path,
                         read_file: Callable[[str], bytes],
                         error: type[ValueError] = ValueError) -> SavedTokenizer:
    """The tokenizer of a checkpoint's or a shards folder's manifest: the reader of
    :func:`tokenizer_entry`'s ``entry``. ``where`` is the manifest (every error names it or the
    tokenizer's file), ``folder`` the folder that holds the tokenizer's file.

    A ``"char"`` entry gives its characters. A ``"bpe"`` entry names ``tokenizer.json``, whose
    bytes ``read_file(name)`` gives once they are checked as the manifest says (a checkpoint lists
    every file's SHA-256, a shards manifest puts it in this entry): its errors pass through.
    Anything else raises ``error`` (the manifest's own: ``CheckpointError``, ``ShardError``).

    A new kind of entry, or a new field of one (say, special tokens of a character tokenizer
    that are longer than one character), is written by :func:`tokenizer_entry`, checked by
    :func:`tokenizer_entry_problem` and read here, for both manifests at once."""
    problem = tokenizer_entry_problem(entry)
    if problem is not None:
        raise error(f"{where}: {problem}: altered")
    fields = cast(dict[str, Any], entry)  # an object of the right shape, checked above
    if fields["type"] == "char":
        try:
            return CharTokenizer(fields["chars"])
        except ValueError as err:  # a character repeated, or longer than one
            raise error(f"{where}: its char tokenizer's {err}: altered") from None
    data = read_file(fields["file"])
    try:
        return BPETokenizer.load(Path(folder) / fields["file"], data=data)
    except ValueError as err:  # the message names the file
        raise error(str(err)) from None
