"""Bounds on one sample's work: a sample that never finishes costs that sample only.

Any stage can hang on one input: a number that sends a library's number-to-words
routine into an endless loop, a decoder stuck on a crafted file, a stalled network
read. The stager takes the grant back after ring.lease_s, but a producer stuck in
the sample never asks for another, and the item, granted again, catches the next
producer too: a few such inputs stop a whole pool. Two bounds, both from
ring.lease_s (the stager gives up on the grant then anyway):

- soft, in the worker (:class:`TimeLimit`): SIGALRM after ring.lease_s raises
  :class:`SampleTimeout` where the work is, the sample is skipped with the stage it
  was in, and the worker goes on. It interrupts Python code only (the alarm's
  handler runs between bytecodes), and needs the process's main thread;
- hard, in the pool (producer/process/pool.py): a worker whose sample has run for
  HARD_FACTOR leases (a hang inside C code the alarm cannot break) is SIGKILLed and
  restarted; the stager charges the item for that death and skips it after
  ring.max_item_attempts. Time the worker spent stopped (SIGSTOP, a debugger) does
  not count: a paused worker is not a stuck one, and comes back by itself
  (producer/process/session.py).

SampleTimeout is a BaseException, so that an ``except Exception`` inside the work
(ours or a library's) cannot swallow it and carry on looping.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

# The pool kills a worker whose one sample has run this many leases.
HARD_FACTOR = 2.0


class SampleTimeout(BaseException):
    """One sample's work ran past its bound (ring.lease_s)."""


class TimeLimit:
    """``with limit:`` raises SampleTimeout in the body after `seconds` (main thread
    only; elsewhere the body runs unbounded, and the pool's hard bound remains). busy:
    a shared double (multiprocessing.Value) that holds when the work began, 0 when
    idle, for the pool's hard bound.

    One per worker: the SIGALRM handler is installed at the first sample and again,
    before each run of samples (:meth:`guard`), only if something replaced it; each
    sample costs two setitimer calls (a handler swapped in and out per sample cost the
    ring ~15 us a sample, and signal.getsignal per sample ~8 % of a cached sample)."""

    def __init__(self, seconds: float, busy: Any = None) -> None:
        self.seconds, self.busy = seconds, busy
        self.armed = seconds > 0 and threading.current_thread() is threading.main_thread()
        self.inside = False
        self.handler = self._expire  # one bound method, so that it can be recognized
        self.guard()

    def _expire(self, signum: int, frame: Any) -> None:
        if self.inside:  # an alarm that lands after the body ended is ignored
            raise SampleTimeout(f"its work took more than ring.lease_s={self.seconds:g} s")

    def __enter__(self) -> None:
        if self.busy is not None:
            self.busy.value = time.monotonic()
        self.inside = True
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def guard(self) -> None:
        """Before a run of samples: the handler installed again if anything replaced it
        (a library's own timeout, a source hook), so the bound never silently stops
        working for more than the run it was replaced in."""
        if self.armed and signal.getsignal(signal.SIGALRM) is not self.handler:
            signal.signal(signal.SIGALRM, self.handler)

    def __exit__(self, *exc: object) -> None:
        self.inside = False
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if self.busy is not None:
            self.busy.value = 0.0


def stuck_for(busy: Any, pid: int | None, now: float) -> float:
    """Seconds the worker `pid` has been in one sample, not counting time it was seen
    stopped (0: idle, stopped now, or unknown)."""
    since = busy.value if busy is not None else 0.0
    if not since:
        return 0.0
    if pid is not None and stopped(pid):
        busy.value = now  # its clock starts again when it runs again
        return 0.0
    return now - since


def stopped(child: int) -> bool:
    """Is this child of ours stopped (SIGSTOP, SIGTSTP)? Asked of the kernel as its
    parent (waitid, leaving the child waitable), not through /proc: in a PID namespace
    without its own /proc mount, /proc/PID is another process."""
    try:
        seen = os.waitid(os.P_PID, child, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError, AttributeError):  # gone, not ours, no waitid
        return False
    return seen is not None and seen.si_code == os.CLD_STOPPED
