"""Unanswered HELLOs back off (producer/process/session.py): a stager that binds minutes late
or stands still for an hour is asked about once RETRY_MAX_S, and its WELCOME rejoins;
on the fake clock of tests/unit/test_session.py."""

from __future__ import annotations

import logging

import pytest

from ringfeed.producer.process.session import RETRY_MAX_S, Rules
from ringfeed.shared.wire import protocol as p
from tests.support.session_loop import RULES, Loop, grants


def gaps(times: list[float]) -> list[float]:
    """Seconds between consecutive HELLOs, rounded to the loop's turn."""
    return [round(b - a) for a, b in zip(times, times[1:], strict=False)]


def test_a_stager_measuring_a_length_table_for_minutes_is_waited_for() -> None:
    """Before its first WELCOME a producer waits as long as it takes, saying HELLO
    again with backoff (a lease, doubled each time, at most RETRY_MAX_S); the orphan
    clock has not started."""
    loop = Loop()
    loop.run(10 * 60.0)  # not a word: the stager is not even bound yet
    assert loop.session.ending is None
    assert gaps(loop.hellos())[:4] == [10, 20, 40, 60] and set(gaps(loop.hellos())[3:]) == {
        RETRY_MAX_S
    }
    loop.welcomed()
    loop.hear(grants(0))
    assert loop.session.take() == p.GrantEntry(0, 1, 0, 0)


def test_a_partition_of_an_hour_heals_the_hellos_backed_off_and_the_welcome_rejoins(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The stager cut off (or SIGSTOPped) for an hour, far inside producers.orphan_s: the
    producer asks about once a RETRY_MAX_S, logs a few lines, not one per HELLO, and the
    first WELCOME after the partition rejoins it with the backoff reset."""
    loop = Loop(Rules(lease_s=10.0, heartbeat_s=1.0, orphan_s=6 * 3600.0, credits=4))
    loop.welcomed()
    with caplog.at_level(logging.WARNING):
        loop.run(3600.0)
    hellos = loop.hellos(since=1000.0)
    assert loop.session.ending is None and 60 <= len(hellos) <= 64
    assert max(gaps(hellos)) == RETRY_MAX_S
    assert caplog.text.count("saying HELLO again") <= 10
    assert "exiting in" in caplog.text  # how long it keeps trying
    loop.welcomed()
    loop.hear(grants(5))
    assert loop.session.take() == p.GrantEntry(5, 1, 5, 5) and loop.session.unanswered == 0
    loop.run(RULES.lease_s + 1.0)  # silent again: the first HELLO waits a lease, not a minute
    loop.run(RULES.lease_s + 1.0)
    assert gaps(loop.hellos(since=loop.now - 30))[:1] == [10]
