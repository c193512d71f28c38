"""Undecodable traffic is charged to the peer that sends it (issue 35, item 3), against
the real stager in this process: a key that floods undecodable messages is struck every
MALFORMED_PER_STRIKE of them, banned at ring.max_strikes, and from then on its messages
are dropped at the socket unread; honest producers of another key deliver every item.
Before, a flood of 52,000 was counted as malformed, never a strike, and cost the stager
40 s of CPU."""

from __future__ import annotations

import collections
import threading
from pathlib import Path

from ringfeed.consumer.stager.peers import MALFORMED_PER_STRIKE
from ringfeed.shared.wire.keys import load_client
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import keyed
from tests.support.liars import in_thread, undecodable_flood
from tests.support.polling import wait_for
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread
from tests.support.stats import StatsReader


def test_a_key_that_floods_undecodable_messages_is_banned_and_then_read_no_more(
    tmp_path: Path,
) -> None:
    n = 300
    config, keys = keyed(tmp_path, ("honest", "flooder"), items=n, delay_s=0.002)
    with stager_thread(config) as stager, StatsReader(stager.stats) as stats:
        cfg, client, stop = stager.cfg, stager.client(), threading.Event()
        flood, tally = in_thread(undecodable_flood, cfg, stager.tcp, str(keys["flooder"]), stop)
        wait_for(lambda: stats.latest().get("counters", {}).get("peers_banned"), 20, "the ban")
        with producer_threads(cfg, stager.tcp, n=2, keys=load_client(keys["honest"])):
            items = consume(client)
            client.close()
        stop.set()
        flood.join(5)
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)
    assert not tally.errors, tally.errors
    dropped = collections.Counter(summary["dropped"])
    counters = summary["counters"]
    assert counters["peers_banned"] == 1 and counters["strikes"] == cfg.ring.max_strikes
    # Decoded until the ban, and not one after: the rest were dropped unread.
    assert dropped["malformed"] == cfg.ring.max_strikes * MALFORMED_PER_STRIKE, dropped
    assert tally.lies > dropped["malformed"] and dropped["banned-peer"] >= 1, dropped
    assert "undecodable messages, the last:" in stager.log.text()
