"""``tinygpt prepare``: text files to a tokenizer and token shards (``tinygpt.shards``).

``write_shards`` is the run: check the inputs and the output folder (only prepare's own files are
ever replaced), reuse a finished folder of the same inputs and options (checked by its manifest)
or the finished shards of a killed run (``.shards-progress.json``; those of a killed run of
other inputs or options are replaced only with ``overwrite``), make the tokenizer, encode the
documents' parts in worker processes (``tinygpt.prepare.workers``), cut each split's tokens into
shards of ``shard_tokens``, write each to a temporary name and rename it, and write
``shards.json`` last. Which files and parts: ``tinygpt.prepare.documents``. It does not read
shards (``tinygpt.shards``) or parse the command line (``tinygpt.cli.prepare``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinygpt import shards as S
from tinygpt.checkpoint.folder import LOCK_FILE, OwnEntries, locked
from tinygpt.files.manifest import (
    TOKENIZER_FILE,
    TOKENIZER_VOCAB_FILE,
    manifest_checksum,
    tokenizer_entry,
)
from tinygpt.files.reading import sha256_of
from tinygpt.files.writing import temporary_names, write_atomically
from tinygpt.prepare import documents
from tinygpt.prepare.documents import Options, find_inputs, parts
from tinygpt.prepare.workers import (
    MAX_WORKERS,
    Mapper,
    cores,
    encode_texts,
    grouped,
    make_tokenizer,
    useful_workers,
)
from tinygpt.tokenizer import EOT

if TYPE_CHECKING:  # numpy is imported when shards are written: the command line starts fast
    import numpy as np

# --- the output folder -----------------------------------------------------------------------

def fingerprint(files: list[tuple[str, Path]], options: Options,
                sizes: dict[Path, int] | None = None) -> dict[str, Any]:
    """What a re-run must find unchanged to reuse a run's shards: options, files' sizes and
    modification times, and their SHA-256: a file rewritten with the same size and its time
    set back (``touch -r``, ``rsync -t``, a restored backup) is not taken for the same. Hashing
    reads the inputs once more, far faster than encoding them. ``sizes``: the bytes of each
    file the run reads (``input_sizes``), hashed and recorded; default: their sizes now."""
    stats = [(name, p, p.stat()) for name, p in files]
    sizes = sizes or {p: s.st_size for _, p, s in stats}
    return {"options": asdict(options),
            "inputs": [[n, sizes[p], s.st_mtime_ns] for n, p, s in stats],
            "sha256": [prefix_sha256(p, sizes[p]) for _, p in files]}


def input_sizes(files: list[tuple[str, Path]]) -> dict[Path, int]:
    """Each input's size as a run begins: the bytes it reads, hashes and records, whatever a
    writer appends meanwhile (a log still written, a download under way)."""
    return {p: p.stat().st_size for _, p in files}


def prefix_sha256(path: Path, size: int) -> str:
    """The SHA-256 of the first ``size`` bytes of ``path`` (fewer if it has shrunk)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while size > 0 and (chunk := f.read(min(size, 1 << 20))):
            digest.update(chunk)
            size -= len(chunk)
    return digest.hexdigest()


def save_json(out: Path, name: str, manifest: dict[str, Any]) -> None:
    """Write a manifest with the checksum of its content (``tinygpt.shards.read_manifest``)."""
    checked = {**manifest, "checksum": manifest_checksum(manifest)}
    write_atomically(json.dumps(checked, indent=1).encode(), out / name)


# A shards folder: the manifests, the tokenizer's files and the lock; the shards; what a killed
# run was writing (write_atomically's temporary names, and the fixed ones of earlier versions of
# tinygpt). Unlike a checkpoint folder, it holds nothing else: check_out refuses any other entry,
# so a new run may remove all of these.
SHARDS_ENTRIES = OwnEntries(
    names=frozenset({S.MANIFEST, S.PROGRESS, TOKENIZER_FILE, TOKENIZER_VOCAB_FILE, LOCK_FILE}),
    numbered=S.SHARD_NAME.pattern,
    temporary=(temporary_names("|".join(map(re.escape, (S.MANIFEST, S.PROGRESS, TOKENIZER_FILE,
                                                        TOKENIZER_VOCAB_FILE)))
                               + "|" + S.SHARD_NAME.pattern)
               + "|" + "|".join(map(re.escape, (".tokenizer.json.part", ".tokenizer.json.vocab")))))


def check_out(out: Path, files: list[tuple[str, Path]]) -> Path:
    """``out`` if prepare may write there: new, empty, or a shards folder (its own files only)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; prepare writes a folder and never replaces it")
    if any(out.resolve() in p.resolve().parents for _, p in files):
        raise ValueError(f"--out {out} holds input files: choose a folder of its own")
    if out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir()):  # the lock: prepare's
        others = SHARDS_ENTRIES.user_entries(out)
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


# --- the run ---------------------------------------------------------------------------------

def _write_shard(out: Path, name: str, tokens: np.ndarray) -> str:
    """Write one shard through a temporary name; its SHA-256. No copy of the tokens is made."""
    import numpy as np

    data = np.ascontiguousarray(tokens).data.cast("B")  # a memoryview of the array's bytes
    write_atomically(data, out / name)
    return hashlib.sha256(data).hexdigest()


def _reusable(out: Path, name: str, fp: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest ``name`` in ``out`` if it is of these inputs and options and its shards are
    intact, else None."""
    import numpy as np

    if not (out / name).is_file():
        return None
    try:
        manifest = S.read_manifest(out, name)
    except S.ShardError:  # altered: not reused (and replaced only with --overwrite)
        return None
    if manifest.get("fingerprint") != fp:
        return None
    dtype = np.dtype(manifest["dtype"])
    try:
        for split in S.SPLITS:
            for entry in manifest["shards"][split]:
                S.check_shard(out, entry, dtype, name=name)
        S.load_shards_tokenizer(out, manifest, name)
    except (S.ShardError, OSError):
        return None
    return manifest


def _other_run(out: Path, fp: dict[str, Any]) -> bool:
    """Whether ``out`` holds the progress of a killed run of other inputs or options (one that
    cannot be read is no run to finish: it is started over)."""
    if not (out / S.PROGRESS).is_file():
        return False
    try:
        return S.read_manifest(out, S.PROGRESS).get("fingerprint") != fp
    except S.ShardError:
        return False


def write_shards(inputs: str | os.PathLike[str], out: str | os.PathLike[str],
                 options: Options | None = None, workers: int | None = None,
                 progress: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Tokenize ``inputs`` (a file, folder or glob) into shards in ``out``; the manifest.

    A finished ``out`` of the same inputs and options is returned as it is; a killed run's
    finished shards are kept. Another shards folder is refused unless ``overwrite``.
    """
    options = options or Options()
    if options.tokenizer not in ("char", "bpe", "gpt2"):
        raise ValueError(f"tokenizer must be char, bpe or gpt2, got {options.tokenizer!r}")
    if not 0 < options.val_fraction < 1:
        raise ValueError(f"--val-fraction must be in (0, 1), got {options.val_fraction}")
    if options.shard_tokens < 1 or (options.tokenizer == "bpe" and options.vocab_size < 257):
        raise ValueError("--shard-tokens must be positive and --vocab-size at least 257 (256 "
                         f"bytes and <|endoftext|>), got {options.shard_tokens}, "
                         f"{options.vocab_size}")
    cpu_cores = cores()
    if workers is None:
        workers = cpu_cores
    if type(workers) is not int or not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"--workers must be a whole number from 1 to {MAX_WORKERS} (this "
                         f"machine has {cpu_cores} cores), got {workers!r}")
    files = find_inputs(inputs)
    workers = useful_workers(workers, files, documents.PART_CHARS)
    folder = Path(inputs).expanduser().resolve()
    if folder.is_dir() and folder in [Path(out).resolve(), *Path(out).resolve().parents]:
        raise ValueError(f"--out {out} is inside the input folder {inputs}: a re-run would read "
                         "the shards as text; choose a folder outside it")
    out = check_out(Path(out).expanduser(), files)
    with locked(out):  # one prepare (or trainer) per folder; a second one is refused
        try:
            return _write_locked(files, out, options, workers, progress, overwrite)
        finally:  # removed while still held: the folder holds only the shards
            with contextlib.suppress(OSError):
                (out / LOCK_FILE).unlink()


def _write_locked(files: list, out: Path, options: Options, workers: int, progress: bool,
                  overwrite: bool) -> dict[str, Any]:
    for p in out.iterdir():  # what a killed run was writing (the lock is ours: no one is now)
        if SHARDS_ENTRIES.is_temporary(p.name) and p.is_file() and not p.is_symlink():
            p.unlink()
    sizes = input_sizes(files)  # read up to these sizes only, should a file grow
    fp = fingerprint(files, options, sizes)
    done = _reusable(out, S.MANIFEST, fp)
    if done is not None:
        return done
    if (out / S.MANIFEST).is_file() and not overwrite:
        raise ValueError(f"{out} holds shards of other inputs or options (or altered ones): "
                         "choose another --out, or pass --overwrite to replace them")
    state = _reusable(out, S.PROGRESS, fp)
    if state is None and not overwrite and _other_run(out, fp):
        raise ValueError(f"{out} holds the finished shards of an unfinished run of other inputs "
                         "or options (killed; its .shards-progress.json): run it again with "
                         "those to finish it, choose another --out, or pass --overwrite to "
                         "replace them")
    if state is None:
        for p in out.iterdir():  # only prepare's own files are in out (check_out)
            if p.name != LOCK_FILE and SHARDS_ENTRIES.owns(p.name):
                p.unlink()
        state = _start(files, options, workers, out, fp, sizes)
    try:
        manifest = _encode_all(files, options, workers, out, state, progress, sizes)
    except UnicodeDecodeError as err:
        raise ValueError(f"an input file is not UTF-8 text ({err.reason} at byte "
                         f"{err.start} of a chunk)") from None
    save_json(out, S.MANIFEST, manifest)  # last: the folder is finished
    (out / S.PROGRESS).unlink()
    return manifest


def _start(files: list, options: Options, workers: int, out: Path,
           fp: dict[str, Any], sizes: dict[Path, int]) -> dict[str, Any]:
    """The progress manifest of a new run, once the tokenizer is made and saved."""
    try:
        tokenizer = make_tokenizer(files, options, workers, sizes)
    except UnicodeDecodeError as err:
        raise ValueError(f"an input file is not UTF-8 text ({err.reason})") from None
    vocab = tokenizer.vocab_size
    entry = tokenizer_entry(tokenizer, out)
    if entry["type"] == "bpe":  # a shards manifest checks the tokenizer's file by its SHA-256
        entry["sha256"] = sha256_of(out / entry["file"])
    state = {"format": S.FORMAT, "version": S.VERSION, "fingerprint": fp,
             "tokenizer": entry, "vocab_size": vocab,
             "dtype": S.shard_dtype(vocab).str,
             "eot": getattr(tokenizer, "special_tokens", {}).get(EOT),
             "shards": {s: [] for s in S.SPLITS},
             "resume": {s: [0, 0] for s in S.SPLITS}}  # (part, token) after the last shard
    save_json(out, S.PROGRESS, state)
    return state


class ProgressSaver:
    """Saves the progress manifest after a shard is written, but not after every one: the file
    lists every shard, so saving it each time made many small shards quadratic (4,914 shards:
    128 s against 5.4 s for 309). It is saved when the shards written since the last save are
    as many as those it held then (after 1, 2, 4, 8... shards: the bytes written stay linear in
    the shards), or when ``SAVE_SECONDS`` have passed and at least 20 times the last save's
    time. A killed run redoes at most the shards written since the last save, and rewrites them
    to the same bytes: a resume is as exact as before."""

    SAVE_SECONDS = 1.0

    def __init__(self, out: Path, state: dict[str, Any]) -> None:
        self.out, self.state = out, state
        self.saved = self.count()  # shards in the file as last saved
        self.last, self.cost = time.monotonic(), 0.0

    def count(self) -> int:
        return sum(len(v) for v in self.state["shards"].values())

    def shard_written(self) -> None:
        now, n = time.monotonic(), self.count()
        if n - self.saved >= max(1, self.saved) or now - self.last >= max(self.SAVE_SECONDS,
                                                                          20 * self.cost):
            save_json(self.out, S.PROGRESS, self.state)
            self.last = time.monotonic()
            self.saved, self.cost = n, self.last - now


def _encode_all(files: list, options: Options, workers: int, out: Path,
                state: dict[str, Any], progress: bool,
                sizes: dict[Path, int]) -> dict[str, Any]:
    """Encode every part not in a finished shard; write the shards; the finished manifest."""
    import numpy as np
    from tqdm.auto import tqdm

    tokenizer = S.load_shards_tokenizer(out, state, S.PROGRESS)  # the unfinished run's
    dtype, eot, resume = np.dtype(state["dtype"]), state["eot"], state["resume"]
    split_fn = getattr(tokenizer, "pre_split", None)  # BPE's pre-split; None for characters
    buffers: dict[str, list[list[Any]]] = {s: [] for s in S.SPLITS}  # [part, offset, tokens]
    documents_done = dict.fromkeys(S.SPLITS, 0)
    held = dict.fromkeys(S.SPLITS, 0)  # tokens in buffers[split]

    saver = ProgressSaver(out, state)

    def flush(split: str, n: int) -> None:
        taken, pieces = 0, []
        while taken < n:
            g, offset, arr = buffers[split][0]
            use = arr[:n - taken]
            pieces.append(use)
            taken += len(use)
            if len(use) == len(arr):
                buffers[split].pop(0)
            else:
                buffers[split][0] = [g, offset + len(use), arr[len(use):]]
        tokens = np.concatenate(pieces)  # pieces are of dtype already
        entries = state["shards"][split]
        name = S.shard_name(split, len(entries))
        entries.append({"file": name, "tokens": len(tokens),
                        "sha256": _write_shard(out, name, tokens)})
        state["resume"][split] = [g, offset + len(use)]
        saver.shard_written()

    total = sum(sizes.values())
    bar = tqdm(total=total, unit="B", unit_scale=True, disable=not progress, desc="prepare")

    def todo() -> Iterator[tuple[tuple[int, str, bool, int], str]]:
        for g, (split, text, last) in enumerate(parts(files, split_fn, options, sizes=sizes)):
            documents_done[split] += last
            if g >= resume[split][0]:  # parts before it are in the finished shards
                yield (g, split, last, len(text.encode())), text
            else:
                bar.update(len(text.encode()))

    mapper = Mapper(workers, tokenizer)
    try:
        tasks = mapper.imap(encode_texts, grouped(todo(), documents.PART_CHARS), 2 * workers)
        for (g, split, last, size), arr in ((k, a) for keys, arrs in tasks
                                             for k, a in zip(keys, arrs, strict=True)):
            if last and eot is not None:
                arr = np.append(arr, eot)
            offset = resume[split][1] if g == resume[split][0] else 0
            buffers[split].append([g, offset, arr[offset:].astype(dtype)])  # 2 bytes an id
            held[split] += len(arr) - offset
            while held[split] >= options.shard_tokens:
                flush(split, options.shard_tokens)
                held[split] -= options.shard_tokens
            bar.update(size)
        for split in S.SPLITS:
            if held[split]:
                flush(split, held[split])
    finally:
        mapper.close()
        bar.close()
    tokens = {s: sum(e["tokens"] for e in state["shards"][s]) for s in S.SPLITS}
    if min(tokens.values()) == 0:
        raise ValueError(f"the split by document left {tokens['train']} training and "
                         f"{tokens['val']} validation tokens ({documents_done['train']} and "
                         f"{documents_done['val']} documents): give more documents (files, or "
                         "<|endoftext|> between documents) or another --val-fraction")
    manifest = {k: v for k, v in state.items() if k != "resume"}
    return {**manifest, "tokens": tokens, "documents": documents_done}
