"""Segments in /dev/shm and ipc socket files: which are ringfeed's, which are dead.

Contract 6: only the owner (the stager) unlinks its segments, and a segment
whose owner pid is dead is stale. The stager removes stale ones at start,
``ringfeed cleanup`` on demand, and scripts/runner.py a finished run's own. A
segment is made under a hidden name that holds its maker's pid and linked into
place whole (Ring.create): a maker killed meanwhile leaves a part, stale once that
pid is dead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ringfeed.shared.config.environment import runtime_dir
from ringfeed.shared.memory.ring import HEADER_DTYPE, PART_PREFIX, SEGMENT_PREFIX, parse_header
from ringfeed.shared.memory.shm import SHM_DIR

log = logging.getLogger(__name__)

# A file under a segment's name without a valid header is no ring Ring.create made (it
# links a segment into place whole); one this young may be another version's still
# being made, seconds.
HALF_MADE_GRACE_S = 5.0


def pid_alive(pid: int) -> bool:
    """True if a process with this pid runs on this host. A zombie (exited, not yet
    reaped by its parent) is dead: it can write no memory and send nothing more."""
    if not 0 < pid < 2**31:  # os.kill raises OverflowError past a C int
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # no /proc (not Linux), or gone since
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"Z"


def read_header(path: Path) -> np.void | None:
    """The header of the segment at `path`, or None if it is gone or not a ring."""
    try:
        with open(path, "rb") as fh:
            return parse_header(fh.read(HEADER_DTYPE.itemsize))
    except OSError:
        return None


def read_owner_pid(path: Path) -> int | None:
    """The owner pid in a segment's header, or None if it is not a ring."""
    header = read_header(path)
    return None if header is None else int(header["owner_pid"])


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def list_segments(run_id: str | None = None) -> Iterator[Path]:
    """ringfeed segments in /dev/shm, optionally of one run: files only (a folder of that
    name is somebody else's, and made every stager's start fail when it was unlinked)."""
    prefix = SEGMENT_PREFIX + (f"{run_id}-" if run_id else "")
    yield from (path for path in sorted(SHM_DIR.glob(prefix + "*")) if not path.is_dir())


def list_parts(run_id: str | None = None) -> Iterator[tuple[Path, int]]:
    """Segments being made (Ring.create), optionally of one run, each with its maker's pid."""
    prefix = PART_PREFIX + SEGMENT_PREFIX + (f"{run_id}-" if run_id else "")
    for path in sorted(SHM_DIR.glob(prefix + "*")):
        pid = path.name.rpartition(".")[2]
        if pid.isdigit():
            yield path, int(pid)


def remove_stale_segments(run_id: str | None = None) -> list[str]:
    """Unlink segments whose owner process is dead, and parts whose maker is (logged);
    returns their names."""
    removed = []
    for path, maker in list_parts(run_id):
        if not pid_alive(maker):
            with contextlib.suppress(FileNotFoundError, PermissionError):
                path.unlink()
                removed.append(path.name)
                log.warning(
                    "removed /dev/shm/%s: its maker (pid %d) died making it", path.name, maker
                )
    for path in list_segments(run_id):
        pid = read_owner_pid(path)
        if pid is not None and pid_alive(pid):
            continue
        if pid is None and _age_s(path) < HALF_MADE_GRACE_S:
            continue  # its creator may be writing the header right now
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except PermissionError:  # another user's file under our prefix: not ours to judge
            log.warning("left /dev/shm/%s alone: it belongs to another user", path.name)
            continue
        removed.append(path.name)
        log.warning("removed stale segment /dev/shm/%s (owner pid %s is gone)", path.name, pid)
    return removed


def socket_files(run_id: str | None = None) -> list[Path]:
    """ringfeed's ipc socket files (shared.config.endpoints), optionally of one run."""
    prefix = SEGMENT_PREFIX + (f"{run_id}-" if run_id else "")
    if not runtime_dir().is_dir():
        return []
    return [p for p in sorted(runtime_dir().glob(prefix + "*")) if p.is_socket()]


def remove_dead_sockets(run_id: str | None = None) -> list[str]:
    """Unlink ipc socket files nobody listens on (a stager killed with SIGKILL leaves
    them; libzmq never removes them); returns their names."""
    removed = []
    for path in socket_files(run_id):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:  # the file is there, its listener is gone
            path.unlink(missing_ok=True)
            removed.append(path.name)
        except OSError:
            continue  # not ours to judge (permissions, a race with its removal)
        finally:
            probe.close()
    return removed
