"""Ctrl-C, SIGTERM and SIGHUP on a loop of one's own: the loader ends the iteration at
the next batch boundary, so the code after the loop (its checkpoint) runs with the
cursor of the last batch trained (docs/loaders.md#stopping-and-resuming).

Python's own Ctrl-C raises KeyboardInterrupt wherever the loop is, mid-step included,
and SIGTERM or SIGHUP end the process at once: a loop lost the steps since its last
checkpoint (5 in issue 49). While the loader hands out batches, a SignalStop takes each
of these signals whose handler is still Python's default (one the script, Lightning or
a launcher set is left alone), and only sets a flag, which the loader reads before
each batch (STYLE 7). A second Ctrl-C at least SECOND_SIGNAL_AFTER_S after the first
raises KeyboardInterrupt at once, as a user who presses it again expects. The handlers
are the main thread's (Python delivers signals there) and are put back when the loader
closes.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import types

from ringfeed.shared.run.process import SECOND_SIGNAL_AFTER_S, STOP_SIGNALS

log = logging.getLogger(__name__)


def is_default(signum: int) -> bool:
    handler = signal.getsignal(signum)
    return handler is signal.SIG_DFL or handler is signal.default_int_handler


class SignalStop:
    """A stop flag the default-handled stop signals set while installed."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._first_at = 0.0
        self._before: dict[int, object] = {}

    def __call__(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def install(self) -> None:
        """Take the stop signals still at their defaults (main thread; else nothing)."""
        if self._before or threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            if is_default(signum):
                self._before[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        """Put the handlers back (main thread; idempotent)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._before.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, handler)
        self._before = {}

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        now = time.monotonic()
        if self.signum is not None:
            if signum == signal.SIGINT and now - self._first_at >= SECOND_SIGNAL_AFTER_S:
                self.restore()
                raise KeyboardInterrupt
            return
        self.signum, self._first_at = signum, now
        log.warning(
            "ringfeed: %s: the loop ends at the next batch boundary, so that the code after "
            "it (a checkpoint) runs; press Ctrl-C again to interrupt at once",
            signal.Signals(signum).name,
        )
