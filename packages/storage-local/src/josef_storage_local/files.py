"""Small file operations the log needs to get exactly right: whole writes, atomic replaces, disk errors."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from josef.log import LogDirError


def write_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    """``pwrite`` all of ``data`` at ``position``, looping over short writes.

    A short write happens when the disk fills up in the middle of a buffer;
    the next call then raises the real error (ENOSPC). A zero-byte write is
    reported as ENOSPC rather than looping forever.
    """
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        if written == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]
        position += written


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a crash leaves either the old or the new file.

    Written to ``<name>.tmp``, fsynced, renamed over the target, then the
    directory is fsynced so the rename itself survives a power loss (as
    Kafka's CheckpointFile does).
    """
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """fsync a directory, making creations, renames and deletions in it durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dir_error(exc: OSError, action: str, path: Path | str) -> LogDirError:
    """A :class:`LogDirError` that says what failed, where, and the errno, for the operator."""
    code = errno.errorcode.get(exc.errno or 0, "unknown error")
    return LogDirError(f"{action} {path} failed: {exc.strerror or exc} ({code})")
