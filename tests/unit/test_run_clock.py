"""The stager's run clock (shared/run/run_clock.py) and what it is for: a stager
that stood still holds no lease and no silence against its producers."""

from __future__ import annotations

import logging

import pytest

from ringfeed.shared.run.run_clock import RunClock


class Fake:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_gaps_longer_than_a_lease_are_left_out_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = Fake()
    clock = RunClock(pause_s=2.0, clock=fake)
    readings = []
    for step in (0.1, 0.5, 1.9, 30.0, 0.1, 2.5, 1.0):  # a stop of 30 s, a slow turn of 2.5
        fake.t += step
        with caplog.at_level(logging.WARNING):
            readings.append(clock())
    ran = [0.1, 0.6, 2.5, 2.5, 2.6, 2.6, 3.6]
    assert readings == pytest.approx([100.0 + r for r in ran])
    assert clock.paused_s == pytest.approx(32.5)
    assert caplog.text.count("the stager did not run for") == 2
    assert "did not run for 30 s" in caplog.text


def test_time_it_ran_counts_in_full() -> None:
    fake = Fake()
    clock = RunClock(pause_s=1.0, clock=fake)
    for _ in range(100):
        fake.t += 0.25
        clock()
    assert clock() == pytest.approx(125.0) and clock.paused_s == 0.0
