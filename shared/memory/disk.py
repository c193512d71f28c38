"""What a full disk says: one line naming the path and the space left there.

Every writer of a run (the corpus index, the feature cache, the shard cache,
checkpoints) turns ENOSPC, or EDQUOT for a full quota, into :class:`DiskFull`,
whose text is that line (a fresh run on a full cache disk once said only "the
corpus index could not be built (exit code 1; its log says why)", issue 35), and
then goes on where it can: the index is built in memory, the feature and shard
caches stop writing, a checkpoint is retried at the next one. /dev/shm has its
own check, made before the rings are created (shared/memory/shm.py).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

# The errors that mean "no room": the disk itself, or this user's quota on it.
FULL = (errno.ENOSPC, errno.EDQUOT)


def is_full(exc: BaseException) -> bool:
    """Is exc a write refused for want of space (ENOSPC, EDQUOT)?"""
    return isinstance(exc, OSError) and exc.errno in FULL


def _sized(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # unreachable: the loop returns at GiB


def space_left(path: str | Path) -> str:
    """'<free> free of <size>' on the file system holding path (its nearest existing
    folder), for this user; '' when it cannot be read."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        st = os.statvfs(where)
    except OSError:
        return ""
    return f"{_sized(st.f_bavail * st.f_frsize)} free of {_sized(st.f_blocks * st.f_frsize)}"


class DiskFull(OSError):
    """A write refused for want of space: str() is one line naming the path and what is
    left there (errno stays ENOSPC or EDQUOT, so callers that test it still can)."""

    def __init__(self, path: str | Path, code: int = errno.ENOSPC) -> None:
        super().__init__(code, os.strerror(code), str(path))
        left = space_left(path)
        self.line = f"no space left on the disk holding {path}" + (f" ({left})" if left else "")

    def __str__(self) -> str:
        return self.line


def disk_error(exc: OSError, path: str | Path) -> OSError:
    """exc as DiskFull naming path when it is a full disk's, else exc itself."""
    if isinstance(exc, DiskFull) or not is_full(exc):
        return exc
    return DiskFull(path, exc.errno)
