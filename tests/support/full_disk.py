"""A full disk for the tests: ENOSPC where a writer meets the OS.

:func:`no_space` makes one function raise ENOSPC, as the kernel would, for the
writers a test drives in its own process. :func:`full_tmpfs` is a real full file
system, a tmpfs mounted and filled; only root can mount one, so it skips the test
elsewhere (CI runs as a user: the injected ENOSPC covers the same code there).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


def no_space(*_: Any, **__: Any) -> Any:
    """Stands in for os.write, fsync, a file's write: the disk is full."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def raising_after(n: int, real: Callable[..., Any]) -> Callable[..., Any]:
    """real for its first n calls, then ENOSPC for every call after."""
    calls = [0]

    def call(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs) if calls[0] <= n else no_space()

    return call


@contextlib.contextmanager
def full_tmpfs(where: Path, size_kib: int = 256) -> Iterator[Path]:
    """A tmpfs of size_kib mounted at where, filled to the last block; unmounted after.
    Skips the test where it cannot be mounted (not root, no mount namespace rights)."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs root to mount a tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        with open(where / "fill", "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
