"""A full disk for the tests: ENOSPC where a writer meets the OS.

:func:`no_space` makes one function raise ENOSPC, as the kernel would, for the
writers a test drives in its own process. A real full file system is a small tmpfs
in a child's own mount namespace (tests/support/processes.py run_on_small_tmpfs).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any


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
