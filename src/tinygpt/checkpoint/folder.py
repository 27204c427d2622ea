"""File safety for checkpoint folders: what is tinygpt's, the lock, the manifest swap, safe reads.

A checkpoint folder (``--out``) may hold a user's files too (notes, samples, logs): tinygpt only
ever writes, replaces or removes its *own* entries, recognised by exact name (nothing here globs):
``checkpoint.json``, the manifest, replaced last by one ``os.replace``; ``step-NNNNNN-xxxxxxxx/``,
one version folder per save (``model.safetensors``, ``optimizer.safetensors``, ``tokenizer.json``,
``tokenizer.vocab``), never changed once the manifest names it and removed only after the manifest
names a newer one; ``.tinygpt.lock``, locked (``flock``) by the one process that trains into the
folder; ``.checkpoint.json.tmp-xxxxxxxx`` and ``.tinygpt-probe-xxxxxxxx``, a manifest being
written and a writability probe. So a reader that reads the manifest, then the files it names,
never sees a mix of two saves. A save needs room for one more checkpoint beside the current one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

from tinygpt.files.locking import CAN_LOCK, open_lock, take_lock
from tinygpt.files.manifest import TOKENIZER_FILE, TOKENIZER_VOCAB_FILE
from tinygpt.files.reading import MAX_JSON, open_regular, read_regular
from tinygpt.files.writing import fsync_dir, temporary_names, write_atomically, write_synced

MANIFEST, LOCK_FILE = "checkpoint.json", ".tinygpt.lock"
MODEL_FILE, OPTIMIZER_FILE = "model.safetensors", "optimizer.safetensors"
VERSION_FILES = (MODEL_FILE, OPTIMIZER_FILE, TOKENIZER_FILE, TOKENIZER_VOCAB_FILE)
FORMAT, VERSION = "tinygpt-checkpoint", 2


class CheckpointError(ValueError):
    """A checkpoint folder is missing, incomplete, corrupt, in use or not tinygpt's to write."""


class MissingCheckpointFile(CheckpointError):
    """A file the checkpoint should hold is not there."""


# --- what is tinygpt's ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OwnEntries:
    """The entries tinygpt writes in one kind of output folder, recognised by exact name or by
    a full match of a regular expression (nothing is globbed): tinygpt replaces or removes these
    and nothing else; every other entry of the folder is the user's.

    ``names`` are the fixed ones (a manifest, the lock), ``numbered`` matches those written
    once per save or per shard, ``temporary`` what a writer killed midway leaves (the next one,
    holding the folder's lock, removes them). A checkpoint folder (``CHECKPOINT_ENTRIES``) and
    a shards folder (``tinygpt.prepare.SHARDS_ENTRIES``) differ in their names and in what
    they allow beside them, which each one's checks decide."""

    names: frozenset[str]
    numbered: str
    temporary: str

    def owns(self, name: str) -> bool:
        """Whether an entry called ``name`` is one that tinygpt writes in such a folder."""
        return name in self.names or self.is_numbered(name) or self.is_temporary(name)

    def is_numbered(self, name: str) -> bool:
        """Whether ``name`` is one of the entries written once per save or per shard."""
        return re.fullmatch(self.numbered, name) is not None

    def is_temporary(self, name: str) -> bool:
        """Whether ``name`` is what a killed writer leaves (its next run removes it)."""
        return re.fullmatch(self.temporary, name) is not None

    def user_entries(self, folder: Path) -> list[str]:
        """The entries of ``folder`` that tinygpt did not write (sorted names)."""
        return sorted(p.name for p in folder.iterdir() if not self.owns(p.name))


# A checkpoint folder: the manifest and the lock; one version folder per save; a manifest being
# written (write_atomically's temporary name, or the .tmp- name of earlier versions of tinygpt)
# and a writability probe. The user's files may stay beside them (check_out_dir says when).
CHECKPOINT_ENTRIES = OwnEntries(
    names=frozenset({MANIFEST, LOCK_FILE}), numbered=r"step-[0-9]{6,}-[0-9a-f]{8}",
    temporary=(temporary_names(re.escape(MANIFEST))
               + r"|\.checkpoint\.json\.tmp-[0-9a-f]{8}|\.tinygpt-probe-[0-9a-f]{8}"))


def new_version(out: Path, step: int) -> Path:
    """Create and return a fresh, empty version folder ``out/step-NNNNNN-xxxxxxxx``."""
    while True:
        folder = out / f"step-{step:06d}-{secrets.token_hex(4)}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


# What a save killed while it wrote the tokenizer's files leaves in a version folder
VERSION_TEMPORARY = re.compile(temporary_names("|".join(map(re.escape, VERSION_FILES))))


def remove_version(folder: Path) -> None:
    """Remove a version folder: only the files tinygpt writes in it (and what a killed save of
    them leaves), then the folder if empty."""
    for name in VERSION_FILES:
        with contextlib.suppress(OSError):
            (folder / name).unlink()
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            if VERSION_TEMPORARY.fullmatch(entry.name) and not entry.is_symlink():
                entry.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()  # fails, and keeps the folder, if anything else is inside


def remove_stale(out: Path, current: str) -> None:
    """Remove tinygpt's leftovers in ``out``: version folders other than ``current`` (the one
    the manifest names), and temporary manifests and probes of killed processes; nothing else."""
    for entry in out.iterdir():
        if entry.name == current:
            continue
        if CHECKPOINT_ENTRIES.is_numbered(entry.name):
            if entry.is_dir() and not entry.is_symlink():
                remove_version(entry)
        elif (CHECKPOINT_ENTRIES.is_temporary(entry.name) and entry.is_file()
              and not entry.is_symlink()):
            with contextlib.suppress(OSError):
                entry.unlink()


def swap_manifest(out: Path, data: bytes) -> None:
    """Write ``data`` as ``out/checkpoint.json`` with one atomic rename (the switch of a save)."""
    write_atomically(data, out / MANIFEST)
    fsync_dir(out)


def open_version_file(path: Path) -> int:
    """A read-only descriptor of a file a checkpoint holds, refusing anything but a regular file
    (FIFO, device, folder) without reading. Once open, the file can be read even if a save
    removes it."""
    return open_regular(path, error=CheckpointError, missing=MissingCheckpointFile,
                        holds="a checkpoint holds regular files only")


def read_checkpoint_file(path: Path, *, max_size: int | None = None, size: int | None = None,
                         fd: int | None = None) -> bytes:
    """The bytes of a file a checkpoint holds (``fd``, from :func:`open_version_file`, if it is
    open already), its length checked before allocating: ``size`` exactly, or at most
    ``max_size``; ``CheckpointError`` naming it otherwise."""
    return read_regular(path, error=CheckpointError, missing=MissingCheckpointFile,
                        max_size=max_size, size=size, fd=fd,
                        holds="a checkpoint holds regular files only")


# --- the lock ------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Holder:
    """This process's hold on a folder's lock: the lock file, how many ``locked`` deep, by whom."""

    fd: int
    depth: int
    thread: int


_held: dict[str, _Holder] = {}  # resolved folder -> its holder in this process
_held_guard = threading.Lock()


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold ``out/.tinygpt.lock`` (``flock``): one trainer per folder. Re-entrant in a thread;
    a second process (or thread) gets ``CheckpointError`` naming the holder's pid."""
    key = str(out.resolve())
    with _held_guard:
        held = _held.get(key)
        if held is not None and held.thread != threading.get_ident():
            raise CheckpointError(f"{out} is in use by another thread of this process (pid "
                                  f"{os.getpid()}): one trainer per checkpoint folder")
        if held is not None:
            held.depth += 1
    if held is not None:
        try:
            yield
        finally:
            held.depth -= 1
        return
    path = out / LOCK_FILE
    fd = open_lock(path, CheckpointError)
    try:
        if CAN_LOCK:  # Windows has no flock: there the folder is not locked
            try:
                free = take_lock(fd)
            except OSError as err:
                raise CheckpointError(f"{path}: cannot lock it ({err.strerror or err}): a file "
                                      "system without locks; choose another --out") from None
            if not free:
                os.lseek(fd, 0, os.SEEK_SET)
                other = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
                raise CheckpointError(
                    f"{out} is in use by another tinygpt process (pid {other}), which holds "
                    f"{path}: wait for it to end, or choose another --out") from None
            try:  # a holder that ends removes the file: this one, locked, is then no lock
                same = os.path.samestat(os.fstat(fd), os.lstat(path))
            except OSError:
                same = False
            if not same:
                raise CheckpointError(f"{out} was in use by another tinygpt process until a "
                                      f"moment ago ({path} was replaced): try again")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode())  # for the message of a second trainer
        with _held_guard:
            _held[key] = _Holder(fd, 1, threading.get_ident())
        try:
            yield
        finally:
            with _held_guard:
                del _held[key]
    finally:
        os.close(fd)  # closing releases the flock


# --- checks before training ----------------------------------------------------------------------

def check_out_dir(spec: str | os.PathLike[str], *, data: str | None = None, resume: bool = False,
                  overwrite: bool = False) -> Path:
    """Refuse an ``--out`` that tinygpt must not write to, before anything is read or trained:
    empty, ``.``/``..``, the current folder, a file, the data file or a folder holding it, a
    folder with a ``checkpoint.json`` that is not tinygpt's, or (without ``resume`` or
    ``overwrite``) a non-empty folder with no checkpoint. Returns the path."""
    raw = os.fspath(spec)
    if not raw.strip():
        raise CheckpointError("--out is empty: name the folder for the checkpoint (e.g. out/run)")
    out = Path(raw).expanduser()
    if out.name in ("", ".", "..") or out.resolve() == Path.cwd().resolve():
        raise CheckpointError(f"--out {raw!r} is the current folder or names a folder by '.' or "
                              "'..': give the checkpoint folder its own name (e.g. out/run)")
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"--out {raw}: is a file, not a folder; tinygpt never replaces it: "
                              "choose another --out")
    if resume and not out.is_dir():
        raise CheckpointError(f"{out}: no such checkpoint folder to --resume")
    if data is not None and Path(data).expanduser().exists():
        found = Path(data).expanduser().resolve()
        if found == out.resolve() or out.resolve() in found.parents:
            raise CheckpointError(f"--out {raw} is or holds the training data {data}: choose a "
                                  "folder of its own for the checkpoint")
    if out.is_dir():
        manifest = out / MANIFEST
        if manifest.is_symlink() or (manifest.exists() and not is_tinygpt_manifest(manifest)):
            raise CheckpointError(f"{manifest} was not written by tinygpt, which never replaces "
                                  "it: move it away or choose another --out")
        others = CHECKPOINT_ENTRIES.user_entries(out)
        if not resume and not manifest.exists() and others and not overwrite:
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            raise CheckpointError(
                f"--out {raw} is not empty ({shown}) and holds no tinygpt checkpoint: choose a "
                "new or empty folder, or pass --overwrite to write the checkpoint beside those "
                "files (tinygpt only writes checkpoint.json, .tinygpt.lock and step-* folders)")
    return out


def is_tinygpt_manifest(manifest: Path) -> bool:
    """Whether the file ``manifest`` starts as a checkpoint's manifest does (its format first),
    however damaged the rest: tinygpt's to replace, not a user's file of the same name."""
    try:
        head = read_checkpoint_file(manifest, max_size=MAX_JSON)[:200]
    except CheckpointError:
        return False
    return any(f'"format":{space}"{FORMAT}"'.encode() in head for space in ("", " "))


def check_writable(out: Path) -> None:
    """Create ``out`` (with parents) and a probe file in it; a clear error naming it if not."""
    probe = out / f".tinygpt-probe-{secrets.token_hex(4)}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_synced(probe, b"tinygpt")
    except OSError as err:
        raise CheckpointError(f"{out}: cannot write a checkpoint there ({err.strerror or err}); "
                              "nothing was trained and nothing in it was changed") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def check_room(out: Path, need: int, *, have_checkpoint: bool) -> None:
    """Refuse to start when the disk of ``out`` lacks room for the saves: a save writes a
    checkpoint of about ``need`` bytes beside the current one, which is removed only after."""
    free = shutil.disk_usage(out).free
    want = need if have_checkpoint else 2 * need  # the first save, then each new one beside it
    if free < want:
        raise CheckpointError(
            f"{out}: {free / 2**20:.1f} MiB free on its disk, but saving this model needs about "
            f"{want / 2**20:.1f} MiB (a checkpoint is about {need / 2**20:.1f} MiB, and a save "
            "writes the new one before removing the previous); nothing was trained and nothing "
            "in it was changed: free some space or choose another --out")


@contextlib.contextmanager
def claim(out: Path) -> Iterator[None]:
    """Create ``out`` if needed and hold its lock while the body runs; a folder created here that
    ends without a checkpoint is removed again (with tinygpt's files in it, and nothing else)."""
    created = not out.exists()
    try:
        check_writable(out)
        with locked(out):
            yield
    finally:
        with _held_guard:
            held = str(out.resolve()) in _held  # by an outer claim of this thread
        if created and out.is_dir() and not (out / MANIFEST).exists() and not held:
            remove_stale(out, current="")  # no checkpoint: remove every version
            with contextlib.suppress(OSError):
                (out / LOCK_FILE).unlink()
            with contextlib.suppress(OSError):
                out.rmdir()
