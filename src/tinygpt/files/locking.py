"""The lock file a process holds while it writes one of tinygpt's folders or cache entries.

A lock is an ``flock`` on a file of its own (``.tinygpt.lock`` in a checkpoint or shards folder,
``.<name>.lock`` beside a cache entry), opened only as a regular file of one link and never
through a symbolic link, so that taking it can harm no other file. Closing the descriptor lets
go of it. Where the system has no ``flock`` (Windows), nothing is locked.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]  # the module's name, or None without it

CAN_LOCK = fcntl is not None  # whether this system has flock at all


def open_lock(path: Path, error: type[Exception] = ValueError) -> int:
    """A read-write descriptor of the lock file ``path``, created if missing; never through a
    symbolic link, and only a regular file of one link (truncating it harms no other file).
    ``error`` (naming the file) otherwise."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if path.is_symlink():
            raise error(f"{path}: is a symbolic link, not tinygpt's lock file; tinygpt never "
                        "writes through it: remove it or choose another folder") from None
        raise error(f"{path.parent}: cannot write there ({err.strerror or err}); nothing was "
                    "written") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(info.st_mode) else "a hard link"
        raise error(f"{path}: {what}, not tinygpt's lock file; tinygpt never writes to it: "
                    "remove it or choose another folder")
    return fd


def take_lock(fd: int, *, wait: bool = False) -> bool:
    """Lock the open lock file ``fd`` (``flock``, exclusive): True once this process holds it;
    False if another process holds it and ``wait`` is False (with ``wait``, block until it lets
    go). ``OSError`` where the file system cannot lock; True, locking nothing, where the system
    has no ``flock`` (``CAN_LOCK`` says which)."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True
