"""The per-sample bound (producer/process/watchdog.py): raises in a body that runs too long,
only there, and keeps working when something else took SIGALRM meanwhile."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from ringfeed.producer.process.watchdog import SampleTimeout, TimeLimit


@pytest.fixture(autouse=True)
def _own_sigalrm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGALRM)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_body_past_its_bound_raises_and_a_quick_one_does_not() -> None:
    limit = TimeLimit(0.2)
    with limit:
        spin(0.05)
    with pytest.raises(SampleTimeout, match="ring.lease_s=0.2"), limit:
        spin(5)
    spin(0.3)  # no alarm left armed after the body: nothing raises here


def test_the_bound_survives_a_handler_put_in_its_place() -> None:
    limit = TimeLimit(0.2)
    with limit:
        pass
    signal.signal(signal.SIGALRM, lambda signum, frame: None)  # a library's own timeout
    limit.guard()  # as the worker does before each run of samples
    with pytest.raises(SampleTimeout), limit:
        spin(5)


def test_busy_says_when_the_sample_began_and_zero_after() -> None:
    class Busy:
        value = 0.0

    busy = Busy()
    limit = TimeLimit(10.0, busy)
    with limit:
        assert busy.value > 0
    assert busy.value == 0.0
