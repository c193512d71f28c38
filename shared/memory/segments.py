"""Segments in /dev/shm and ipc socket files: which are ringfeed's, which are dead.

Contract 6: only the owner (the stager) unlinks its segments, and a segment is
stale once its owner is dead. The stager removes stale ones at start,
``ringfeed cleanup`` on demand, and scripts/runner.py a finished run's own.

An owner is alive while it holds its segment's flock (Ring.create takes it
before the segment has a name), which holds across pid namespaces: containers
that share one /dev/shm (``--ipc=host``) each see the others' pids as dead. A
segment nobody holds (an older ringfeed's, or one made on a filesystem without
flock) is judged by its owner pid, which can be another process's by then (pids
are reused, and a restarted container numbers from 1 again): an owner that
started after its segment was made is dead too.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ringfeed.shared.config.environment import runtime_dir
from ringfeed.shared.memory.ring import HEADER_DTYPE, SEGMENT_PREFIX, parse_header
from ringfeed.shared.memory.shm import SHM_DIR

log = logging.getLogger(__name__)

# Ring.create names a segment only once its header is written; a file without one this
# young may be an older ringfeed's still being made, seconds.
HALF_MADE_GRACE_S = 5.0
# An "owner" that started this long after its segment was made has only its pid:
# seconds of slack for /proc's 10 ms ticks and the wall clock's small steps.
REUSED_PID_SLACK_S = 2.0


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
    fields = _proc_stat(pid)
    return fields is not None and fields[0] == b"Z"


def _proc_stat(pid: int) -> list[bytes] | None:
    """/proc/PID/stat from its third field (the state) on, past the command name, which
    may hold spaces; None without it (no /proc, or gone since)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()


def segment_live(path: Path, header: np.void) -> bool:
    """Does the owner of the segment at `path` (its header read) still run?"""
    return held(path) or owner_alive(int(header["owner_pid"]), float(header["created_s"]))


def held(path: Path) -> bool:
    """Is the segment's flock held (by its live owner: Ring.create)? A shared lock
    tried without waiting, and let go at once."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # gone, or another user's
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no flock here: the pid decides
        return False
    finally:
        os.close(fd)  # our lock, if taken, goes with it
    return False


def owner_alive(pid: int, created_s: float) -> bool:
    """Does the process that made a segment at created_s (time.time()) still run as
    `pid`? Not if the pid is dead, nor if the process now under it started later."""
    if not pid_alive(pid):
        return False
    started = started_s(pid)
    return started is None or started <= created_s + REUSED_PID_SLACK_S


def started_s(pid: int) -> float | None:
    """When process `pid` started, as time.time() counts (None where /proc says not)."""
    fields, boot = _proc_stat(pid), _boot_s()
    if fields is None or len(fields) < 20 or not fields[19].isdigit() or boot is None:
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime


@functools.cache
def _boot_s() -> float | None:
    try:
        with open("/proc/stat", "rb") as f:
            line = next(x for x in f if x.startswith(b"btime "))
        return float(line.split()[1])
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def read_header(path: Path) -> np.void | None:
    """The header of the segment at `path`, or None if it is gone or not a ring."""
    try:
        with open(path, "rb") as fh:
            return parse_header(fh.read(HEADER_DTYPE.itemsize))
    except OSError:
        return None


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


def remove_stale_segments(run_id: str | None = None) -> list[str]:
    """Unlink segments whose owner process is dead (logged); returns their names."""
    removed = []
    for path in list_segments(run_id):
        header = read_header(path)
        pid = None if header is None else int(header["owner_pid"])
        if header is None:
            if _age_s(path) < HALF_MADE_GRACE_S:
                continue  # its creator may be writing the header right now
        elif segment_live(path, header):
            continue
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
