"""Writing tinygpt's own files so that a reader never sees half of one and a crash loses nothing.

``write_atomically`` writes a file through a temporary name in its folder, flushed to the disk,
then renamed into place: a reader sees the old file or the new one. ``write_synced`` creates a
new file (it must not exist) and flushes it, for the files of a folder nothing reads until a
manifest names them; ``fsync_dir`` flushes a folder's entries after a rename in it.
``temporary_names`` says which names a killed writer leaves, so that the next one, and nothing
else, may remove them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


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


def write_synced(path: Path, data: bytes) -> None:
    """Create ``path`` (it must not exist) holding ``data``, flushed to the disk."""
    try:
        with open(path, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:  # f.write names no file: name it (a full disk, say)
        if err.filename is None:
            err.filename = str(path)
        raise


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename in it) to the disk, where the system allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # folders cannot be opened on some systems (Windows)
        return
    with contextlib.suppress(OSError):
        os.fsync(fd)
    os.close(fd)
