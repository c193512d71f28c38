"""A clock of the time a process ran: monotonic seconds, less every gap longer than
``pause_s`` between two readings.

Only time a process ran counts against its peers. A stager that did not run for a while
(SIGSTOP, a suspended VM, a turn of its loop that took that long) must not hold that
time against its producers: their grants did not age, their silence was the stager's.
So its leases, silences, fences and strike windows read this clock, with pause_s
ring.lease_s; its loop reads it at least every LEASE_CHECK_S
(consumer/stager/stager.py), so a gap that long means the stager itself stood still,
and the first reading after it logs the pause once. A consumer's waits for a batch read
one too (consumer/client/batch_client.py, pause_s PAUSED_S): a consumer stopped while it
waited, or busy elsewhere between two waits, has not waited for the stager meanwhile.
Producers keep the same rule in their session (producer/process/session.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class RunClock:
    """Callable like time.monotonic, less the gaps longer than pause_s (see above); who:
    the process named in the line a pause logs ("": none is logged)."""

    def __init__(
        self, pause_s: float, clock: Callable[[], float] = time.monotonic, who: str = "the stager"
    ) -> None:
        self.pause_s, self.clock, self.who = pause_s, clock, who
        self.last = clock()
        self.paused_s = 0.0  # all the gaps left out so far

    def __call__(self) -> float:
        now = self.clock()
        gap, self.last = now - self.last, now
        if gap > self.pause_s:
            self.paused_s += gap
            if self.who:
                log.warning(
                    "%s did not run for %.0f s (stopped, or suspended); that "
                    "time counts against no lease and no producer",
                    self.who,
                    gap,
                )
        return now - self.paused_s
