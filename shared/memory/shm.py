"""Room in /dev/shm: how much is free, and memory a ring owns from its creation on.

``ftruncate`` on tmpfs reserves nothing: a segment of any size is created at
once and its pages are taken only when first written. Two 2.9 MiB rings were
both created on a 4 MiB /dev/shm, and the first write past the end of the free
space killed the writing process with SIGBUS mid-run (issue 18, case 6). So the
owner reserves the whole segment when it creates it (:func:`reserve`): a
/dev/shm that is too small is an error at start that says what to change, and
a ring that exists can be written in full.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from ringfeed.shared.config import ConfigError

SHM_DIR = Path("/dev/shm")  # where POSIX shared memory lives on Linux
# posix_fallocate errors that mean "this filesystem cannot reserve", not "no room".
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_ZEROS = bytes(1 << 20)  # what write_zeros writes per call, 1 MiB


def free_shm_bytes() -> int:
    return shutil.disk_usage(SHM_DIR).free


def _advice(key: str, slot: int) -> str:
    return (
        f"lower {key} (each slot is {slot / 2**20:.2f} MiB) or features.max_frames, "
        "or enlarge /dev/shm (docker: --shm-size)"
    )


def check_shm_fits(need: int, what: str, key: str, slot: int) -> None:
    """ConfigError, saying what to change, if `need` bytes of `what` do not fit in free
    /dev/shm; key: the setting that counts its slots, slot: bytes of one slot."""
    free = free_shm_bytes()
    if need > free:
        raise ConfigError(
            f"{key}: {what} need {need / 2**20:.1f} MiB, but /dev/shm has {free / 2**20:.1f} "
            f"MiB free; {_advice(key, slot)}"
        )


def reserve(fd: int, nbytes: int, what: str, key: str, slot: int) -> None:
    """Size the new file `fd` to `nbytes` with every byte's memory taken now: the ring's
    creator (the stager) calls this before it maps the segment. ConfigError, saying what
    to change, if /dev/shm cannot hold it (or RLIMIT_FSIZE forbids it); the caller
    removes the file."""
    try:
        fallocate = getattr(os, "posix_fallocate", None)  # absent on macOS
        try:
            if fallocate is None:
                raise OSError(errno.ENOSYS, "no posix_fallocate")
            fallocate(fd, 0, nbytes)
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
            os.ftruncate(fd, nbytes)
            write_zeros(fd, nbytes)
    except OSError as exc:
        raise ConfigError(
            f"{key}: cannot reserve {nbytes / 2**20:.1f} MiB in /dev/shm for {what} "
            f"({exc.strerror}; {free_shm_bytes() / 2**20:.1f} MiB free now); {_advice(key, slot)}"
        ) from exc


def write_zeros(fd: int, nbytes: int) -> None:
    """Write zeros over the first `nbytes` of `fd`, so tmpfs takes every page now (where
    posix_fallocate cannot); OSError (ENOSPC, EFBIG) where they do not fit."""
    done = 0
    while done < nbytes:
        done += os.pwrite(fd, memoryview(_ZEROS)[: min(len(_ZEROS), nbytes - done)], done)
