"""One consumer means one socket (issue 35, item 5), against the real stager in this
process: a second client of the holder's own process, in another thread, is refused
while the holder lives, instead of each taking the run from the other (20 takeovers,
1,081 items to both, seen before); a client made anew with rejoin=True takes the run
over from its own process, and the one it replaced is told so and stops.
(Consumers in other processes: tests/process/test_one_consumer.py.)"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ringfeed.consumer.client.batch_client import StagerRefused
from ringfeed.producer.sources import check_synthetic_rows
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread


def test_a_second_client_of_the_holders_process_is_refused(tmp_path: Path) -> None:
    n = 300
    with stager_thread(small(tmp_path, items=n, delay_s=0.002)) as stager:
        cfg, first = stager.cfg, stager.client("first")
        refused: list[BaseException] = []

        def second_in_a_thread(n_taken: int) -> None:
            if n_taken < 40 or refused:
                return

            def connect() -> None:
                try:
                    stager.client("second", timeout_s=10)
                except StagerRefused as exc:
                    refused.append(exc)

            thread = threading.Thread(target=connect)
            thread.start()
            thread.join(30)

        with producer_threads(cfg, stager.control, n=2):
            items = consume(first, on_batch=second_in_a_thread)
            first.close()
        summary = stager.summary()
    assert refused, "the second client was not refused"
    assert "held by consumer 'first'" in str(refused[0])
    assert "rejoin=True" in str(refused[0])  # what to change, in the same process
    assert_exactly_once(items, cfg, n)
    assert summary["dropped"].get("refused-consumer", 0) >= 1, summary["dropped"]
    assert stager.log.text().count("starts at plan position") == 1


def test_a_client_made_anew_rejoins_and_the_old_one_is_refused(tmp_path: Path) -> None:
    n = 300
    with stager_thread(small(tmp_path, items=n, delay_s=0.002)) as stager:
        cfg, old = stager.cfg, stager.client("old")
        with producer_threads(cfg, stager.control, n=2):
            items: list[int] = []
            for _ in range(4):
                batch = old.next(timeout_s=30)
                items += check_synthetic_rows(batch.arrays, batch.meta.n_valid, cfg)
                old.free(batch)
            new = stager.client(
                "new", position=old.position, batch_index=old.batch_index, rejoin=True
            )
            # The old client is told at once (after what was queued for it), and were it
            # to say hello again it would be refused: it never takes the run back.
            with pytest.raises(StagerRefused, match="consumer 'new' .*took the run over"):
                while old.next(timeout_s=5) is not None:
                    pass
            items += consume(new)
            new.close()
        assert stager.ended() == 0  # the run ended cleanly, by the new consumer's BYE
    assert_exactly_once(items, cfg, n)
    # The same process: not logged as a fault (a loader moving its cursor does this).
    assert "consumer new (pid" in stager.log.text() and "replaces" not in stager.log.text()
