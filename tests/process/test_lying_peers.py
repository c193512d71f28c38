"""A lie costs the liar, never an item, with real stager and producer processes (issue
18's cases 5 and 11): a local liar is struck out while the honest pool delivers; a bad
item costs one attempt per run. The other liars play against the stager in the test
process (tests/unit/test_lying_peers.py). Each run must deliver its epoch exactly once
with every row checked, quarantine no innocent item, and end in bounded time."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import endpoints, run_dir
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.fault_sources import inject_faults
from tests.support.liars import in_thread, lie_per_grant
from tests.support.runs import Run, finish, rid, started

pytestmark = pytest.mark.slow


def test_a_local_liar_is_struck_out_and_no_item_pays(tmp_path: Path) -> None:
    """Case 5 (token id 1,000,000 and NaN mels, sealed and hashed, HELLO again, repeat):
    each lie is a strike, never a charge on the item (case 1's lie too, in the test
    process: tests/unit/test_lying_peers.py)."""
    n = 200
    cfg_path = small(tmp_path, items=n, delay_s=0.005, producers={"workers": 1})
    cfg, run_id, stop = load_config(cfg_path), rid(), threading.Event()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        client = run.client(timeout_s=30)
        control = endpoints(cfg, run_id).control
        thread, tally = in_thread(lie_per_grant, cfg, control, "", stop, "content")
        run.poll_for(lambda: tally.refusals, 20, "the liar refused")
        run.start("producers")
        items = consume(client)
        stop.set()
        thread.join(5)
        client.close()
        summary = finish(run, "producers")
    assert_exactly_once(items, cfg, n)  # every row checked: no bad content got through
    assert not tally.errors, tally.errors
    assert tally.lies >= cfg.ring.max_strikes and tally.refusals >= 1, tally
    counters = summary["counters"]
    assert counters["strikes"] == cfg.ring.max_strikes and counters["peers_banned"] == 1
    assert counters["skipped"] == 0
    assert read_quarantine(run_dir(cfg, run_id) / "quarantine.jsonl") == []


def test_a_bad_item_costs_one_attempt_per_run(tmp_path: Path) -> None:
    """Case 11: epochs of 10 items, 4 batches of 8 ahead: every item's next two epochs are
    in the grant window when it first fails. Each bad item is tried once in the run."""
    n, epochs, bad = 10, 3, (2, 5, 7)
    cfg_path = small(tmp_path, items=n, ring={"lookahead": 4}, stager={"epochs": epochs})
    inject_faults(cfg_path, raise_items=bad, delay_s=0.005)
    run_id = rid()
    with started(cfg_path, tmp_path, run_id=run_id) as (run, client):
        items = consume(client)
        client.close()
        summary = finish(run, "producers")
        logs = run.logs(tail=1_000_000)
    assert sorted(items) == sorted([i for i in range(n) if i not in bad] * epochs)
    assert summary["counters"]["skipped"] == len(bad) * epochs
    for item in bad:
        assert logs.count(f"item {item} failed") == 1, f"item {item} tried more than once"
