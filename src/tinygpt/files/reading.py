"""Reading tinygpt's own files: only a regular file, of a bounded size, and never blocking.

A path named by a user or by a manifest may be anything: a FIFO that blocks the reader forever,
a device that never ends, a folder, a link out of the folder, or a file far larger than any
tinygpt writes. ``open_regular`` opens it without blocking and refuses all but a regular file
before reading a byte; ``read_regular`` then reads it whole, checking its length first. Each error
is the caller's own (a checkpoint's, a shards folder's, the results cache's), naming the file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

MAX_JSON = 1 << 30  # a manifest or tokenizer file larger than 1 GiB is not one of ours


def open_regular(path: Path, *, error: type[Exception] = ValueError,
                 missing: type[Exception] | None = None, follow_links: bool = True,
                 max_size: int | None = None, holds: str = "") -> int:
    """A read-only descriptor of ``path`` if it is a regular file (of at most ``max_size``
    bytes); a FIFO, device or folder is refused without reading, and without ``follow_links``
    so is a symbolic link. Once open, the file can be read even if another process removes it.

    Errors raise ``error`` (``missing`` for a file that is not there, when given), naming
    ``path``; ``holds`` ends the message of a wrong kind of file ("a checkpoint holds regular
    files only")."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)  # a FIFO does not block the open
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    why = f"; {holds}" if holds else ""
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise (missing or error)(f"{path}: missing") from None
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_links:
            raise error(f"{path}: is a symbolic link{why}") from None
        raise error(f"{path}: cannot read it ({err.strerror or err})") from None
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "not a regular file (a folder, device, FIFO or socket)"
    elif max_size is not None and info.st_size > max_size:
        problem = f"{info.st_size} bytes, more than the {max_size} such a file can hold"
    if problem:
        os.close(fd)
        raise error(f"{path}: {problem}{why}")
    return fd


def read_regular(path: Path, *, error: type[Exception] = ValueError,
                 missing: type[Exception] | None = None, follow_links: bool = True,
                 max_size: int | None = None, size: int | None = None, fd: int | None = None,
                 holds: str = "") -> bytes:
    """The bytes of the regular file ``path`` (``fd``, from :func:`open_regular`, if it is open
    already), its length checked before anything is allocated: ``size`` exactly (what a manifest
    says), or at most ``max_size``. Errors as :func:`open_regular`'s."""
    if fd is None:
        fd = open_regular(path, error=error, missing=missing, follow_links=follow_links,
                          holds=holds)
    info = os.fstat(fd)
    with os.fdopen(fd, "rb") as f:
        if size is not None and info.st_size != size:
            raise error(f"{path}: {info.st_size} bytes, but the manifest says {size}: the file "
                        "is truncated or was replaced")
        if max_size is not None and info.st_size > max_size:
            raise error(f"{path}: {info.st_size} bytes, more than the {max_size} such a file "
                        "can hold")
        data = f.read(info.st_size + 1)
    if len(data) != info.st_size:
        raise error(f"{path}: changed size while it was read")
    return data


def sha256_of(path: Path) -> str:
    """The SHA-256 hex digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
