"""What every ringfeed process does the same way: logging, stop signals, timeouts.

The signal handler only sets a flag (STYLE 7); loops poll with POLL_S and
check it. The one exception is work that stops by unwinding, each step cleaning up in
its finally (`ringfeed prepare`): interrupted_by_stop_signals raises there. Every
blocking call uses a timeout derived from POLL_S or SHUTDOWN_WAIT_S, so no process can
block forever on a dead peer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Longest a loop blocks in one poll before it checks its stop flag, seconds.
POLL_S = 0.05
# How long a process waits for peers to acknowledge its goodbye, seconds.
SHUTDOWN_WAIT_S = 2.0
# Meanwhile, how often it says its goodbye again (a lost BYE, or a lost BYE_ACK: the
# stager answers each), seconds.
BYE_AGAIN_S = 0.5
# How long a parent waits for a child after SIGTERM before SIGKILL, seconds.
TERM_GRACE_S = 5.0

# prctl(2) option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1

# The signals that stop a process as Ctrl-C does: SIGHUP too, which a closed terminal or a
# dropped ssh session sends its whole process group (issue 49: it killed every process
# of a run at once, with no checkpoint and its segments left in /dev/shm).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

LOG_FORMAT = "%(asctime)s %(levelname).1s %(processName)s %(name)s: %(message)s"


class _ShortNames(logging.Formatter):
    """Log lines name the module without the package: consumer.stager.stager, not
    ringfeed.consumer.stager.stager (concise, and the repository's folder names). The
    record itself keeps its name: another handler (a user's, pytest's caplog) sees the
    logger's real one."""

    def format(self, record: logging.LogRecord) -> str:
        name = record.name
        record.name = name.removeprefix("ringfeed.")
        try:
            return super().format(record)
        finally:
            record.name = name


def setup_logging(level: str = "INFO") -> None:
    """Concise logs on stderr, one line each, with the process name; where the process
    has a logging set-up already (a user's, a test's), it is left as it is."""
    root = logging.getLogger()
    had_handlers = bool(root.handlers)
    logging.basicConfig(level=level, format=LOG_FORMAT, datefmt="%H:%M:%S", stream=sys.stderr)
    if not had_handlers:
        for handler in root.handlers:
            handler.setFormatter(_ShortNames(LOG_FORMAT, "%H:%M:%S"))
    logging.getLogger("absl").setLevel(logging.WARNING)  # TF's per-checkpoint chatter


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so a reader sees the old file or the whole new one, never half, and
    the new one survives a power loss once this returns (checkpoint sidecars decide
    where a resume starts): temp file, fsync, os.replace, fsync of the directory."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, indent=2, sort_keys=True))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself lives in the directory
    finally:
        os.close(fd)


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask Linux to send this process `signum` when its parent dies (PR_SET_PDEATHSIG), so
    a launcher killed with SIGKILL leaves no process of its run behind. No-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
        os.kill(os.getpid(), signum)


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGINT or SIGTERM) came during work that stops by unwinding."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interrupted_by_stop_signals() -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise Interrupted in the main thread, whatever the
    disposition this process inherited. For work written to stop by unwinding (each step
    cleans up in its finally: `ringfeed prepare`), not for the loops of a long-lived
    process, which poll a StopFlag. A process started in the background by a shell
    without job control (`cmd &` in a script, nohup, a CI runner) inherits SIGINT
    ignored, and Python then leaves it ignored: a Ctrl-C or `kill -INT` did nothing
    there, and a SIGTERM ended the work without its cleanup."""

    def handle(signum: int, frame: types.FrameType | None) -> None:
        raise Interrupted(signum)

    before = {s: signal.signal(s, handle) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


# The exit code of a producer pool every worker of which lost its stager (told apart
# from 1, crashes past producers.max_restarts, which no restart of the pool fixes): the
# launcher starts a local pool again while the stager runs (scripts/runner.py).
POOL_ORPHANED = 4
# The exit code of a stager that ended its run because no consumer was there for
# stager.consumer_wait_s (consumer/stager/consumer_side.py).
STAGER_NO_CONSUMER = 6
# A second stop signal this long after the first exits at once (StopFlag.install).
SECOND_SIGNAL_AFTER_S = 1.0


class Stopped(BaseException):
    """A stop signal came while a process was still starting (StopFlag.raising): it ends
    as a clean stop (exit 0, as a stop once running), not as a failure of what it was
    doing. A BaseException, as KeyboardInterrupt is: no `except Exception` of the start
    (a warm-up's, say) takes it for that step's failure and goes on."""


class StopFlag:
    """Set by SIGTERM, SIGINT or SIGHUP (and by code); loops check `is_set()`."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal: int | None = None
        self._first_at: float | None = None
        self._second_exits = False
        self._raises = False

    def install(self, second_exits: bool = False) -> StopFlag:
        """Route SIGTERM, SIGINT and SIGHUP to this flag (main thread only). second_exits: a
        signal at least SECOND_SIGNAL_AFTER_S after the first exits at once (a user who
        presses Ctrl-C again does not want to wait for a checkpoint); sooner, it is the
        same stop (Ctrl-C reaches the whole process group and the launcher's SIGTERM
        follows at once)."""
        self._second_exits = second_exits
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        now = time.monotonic()
        if self._first_at is None:
            self._first_at = now
        elif self._second_exits and now - self._first_at >= SECOND_SIGNAL_AFTER_S:
            os.write(2, b"second signal: exiting at once, without a checkpoint\n")
            os._exit(128 + signum)
        self.signal = signum
        self._event.set()
        if self._raises:
            self._raises = False  # once: the unwinding's cleanup is not cut short
            raise Stopped(f"stopped by {signal.Signals(signum).name} while starting")

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """Within: a stop signal also raises Stopped (at once, if one came before). For a
        process's start, which polls nothing and takes seconds on a busy host (the
        launcher's grace is RINGFEED_GRACE_S): written to clean up by unwinding (an
        ExitStack), it stops there, not after it has started everything."""
        self._raises = True
        try:
            if self.is_set():
                raise Stopped("stopped by a signal while starting")
            yield
        finally:
            self._raises = False

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Within raising(): a stop waits until this ends (then raises Stopped), for a few
        steps that must not be cut apart: a segment created and its unlink registered, a
        socket bound and its close. A flag, not a blocked signal mask: a signal may land
        on any thread."""
        raises, self._raises = self._raises, False
        try:
            yield
        finally:
            self._raises = raises
        if raises and self.is_set():
            raise Stopped("stopped by a signal while starting")

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float) -> bool:
        return self._event.wait(timeout_s)
