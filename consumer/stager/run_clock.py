"""The stager's clock for leases and silences: monotonic seconds it ran.

A stager that did not run for a while (SIGSTOP, a suspended VM, a turn of its loop
that took that long) must not hold that time against its producers: their
grants did not age, their silence was the stager's. So leases, silences, fences
and strike windows read this clock, which leaves out every gap longer than
``pause_s`` (ring.lease_s) between two readings. The stager's loop reads it at
least every LEASE_CHECK_S (consumer/stager/stager.py), so a gap that long means
the stager itself stood still; the first reading after it logs the pause once.
The same rule holds for producers (producer/process/session.py): only time a process ran
counts against its peers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class RunClock:
    """Callable like time.monotonic, less the gaps longer than pause_s (see above)."""

    def __init__(self, pause_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.pause_s, self.clock = pause_s, clock
        self.last = clock()
        self.paused_s = 0.0  # all the gaps left out so far

    def __call__(self) -> float:
        now = self.clock()
        gap, self.last = now - self.last, now
        if gap > self.pause_s:
            self.paused_s += gap
            log.warning(
                "the stager did not run for %.0f s (stopped, or suspended); that "
                "time counts against no lease and no producer",
                gap,
            )
        return now - self.paused_s
