"""The one way a test waits for something to happen: poll a condition until it holds,
within a deadline.

A fixed sleep that is long enough on an idle machine is too short on 2 loaded
cores and too long everywhere else; a poll returns as soon as the thing happened
and says what never did.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.05


def wait_for(
    condition: Callable[[], T],
    timeout_s: float,
    what: str,
    interval_s: float = POLL_S,
    context: Callable[[], str] | None = None,
) -> T:
    """Call condition() every interval_s until it returns something true, and return that.

    After timeout_s, fail with an AssertionError naming `what`, followed by context()
    if given (a run's logs, say). interval_s 0 suits a condition that blocks itself (a
    socket poll with a timeout)."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            details = f"\n{context()}" if context is not None else ""
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}{details}")
        time.sleep(interval_s)
    return value
