"""Names belong to keys (issue 35, item 4), against the real stager in this process: a
key that joins first under the names an honest key's producers will use holds nothing
of theirs (they join and deliver every item), and a second process of the same key
under a live name is refused, told who holds it. Before, names were global: the honest
pool was refused 294 times and delivered nothing."""

from __future__ import annotations

import collections
import threading
from pathlib import Path

import zmq

from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.keys import load_client
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import keyed
from tests.support.liars import connect, in_thread, name_squatter, receive
from tests.support.polling import wait_for
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread
from tests.support.stats import StatsReader


def test_a_key_cannot_hold_another_keys_names(tmp_path: Path) -> None:
    n = 300
    config, keys = keyed(tmp_path, ("honest", "squatter"), items=n, delay_s=0.002)
    names = [f"thread-{k}" for k in range(2)]  # what producer_threads will call them
    with stager_thread(config) as stager, StatsReader(stager.stats) as stats:
        cfg, client, stop = stager.cfg, stager.client(), threading.Event()
        squat, tally = in_thread(name_squatter, cfg, stager.tcp, str(keys["squatter"]), stop, names)
        wait_for(lambda: tally.joins >= len(names), 20, "the squatter holding the names")
        honest = load_client(keys["honest"])
        with producer_threads(cfg, stager.tcp, n=2, keys=honest):
            items = consume(client)
            rows = stats.latest().get("producers", [])
            client.close()
        stop.set()
        squat.join(5)
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)
    assert not tally.errors, tally.errors
    assert collections.Counter(pr["name"] for pr in rows) == {name: 2 for name in names}, rows
    assert summary["dropped"].get("refused-hello", 0) == 0, summary["dropped"]


def test_a_second_process_of_one_key_is_refused_a_live_name_told_who_holds_it(
    tmp_path: Path,
) -> None:
    config, keys = keyed(tmp_path, ("one",), items=50)
    with stager_thread(config) as stager:
        prints = config_fingerprint(stager.cfg)
        with zmq.Context() as ctx:
            first, second = (connect(ctx, stager.tcp, str(keys["one"])) for _ in range(2))
            first.send_multipart(p.encode(p.Hello("p0", 7, "far", True, "a", "", prints)))
            assert isinstance(receive(first, 10), p.Welcome)
            second.send_multipart(p.encode(p.Hello("p0", 8, "far", True, "b", "", prints)))
            assert receive(second, 1) is None  # no WELCOME: it says HELLO again later
            first.close()
            second.close()
        stager.stop()
        stager.ended()
    said = stager.log.text()
    assert "name 'p0' of key " in said and "is taken by its live producer (pid 7 on far" in said
