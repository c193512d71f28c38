"""Peers that hold a way in (the ipc socket, or a valid CURVE key) and lie (issue 18's
cases 1, 2, 3 and 5), against the real stager in this process (its sockets and rings;
tests/support/stager_thread.py) with honest producer threads. The liars play the
protocol by hand (tests/support/liars.py). Each run must deliver its epoch exactly once
with every row checked, quarantine no innocent item, and end in bounded time. With real
producer processes: tests/process/test_lying_peers.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.shared.wire.keys import load_client
from tests.support.checks import assert_exactly_once, check_stager_rows, consume, plan_items
from tests.support.configs import ALL_REMOTE, keyed
from tests.support.liars import (
    bad_checksums,
    in_thread,
    lie_per_grant,
    silent_identities,
    three_bad_rows,
)
from tests.support.polling import wait_for
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread
from tests.support.stats import StatsReader


@pytest.mark.parametrize("lie", ["malformed", "huge-lengths", "content"])
def test_a_local_liar_is_struck_out_and_no_item_pays(tmp_path: Path, lie: str) -> None:
    """Case 1 (lengths [0, 0], HELLO again, repeat; or lengths of 2**53 - 1 and 2**31,
    which the wire carries and an int32 does not: they had raised OverflowError in the
    stager's loop and ended the run) and case 5 (token id 1,000,000 and NaN mels, sealed
    and hashed): each lie is a strike, never a charge on the item. The liar is this
    process on the ipc socket; the honest producer holds a key of its own."""
    n = 200
    cfg_path, keys = keyed(tmp_path, ("honest",), items=n, delay_s=0.005)
    stop = threading.Event()
    with stager_thread(cfg_path) as stager:
        cfg, client = stager.cfg, stager.client()
        thread, tally = in_thread(lie_per_grant, cfg, stager.control, "", stop, lie)
        wait_for(lambda: tally.refusals, 20, "the liar refused")
        with producer_threads(cfg, stager.tcp, keys=load_client(keys["honest"])):
            items = consume(client)
            client.close()
        stop.set()
        thread.join(5)
        summary = stager.summary()
        quarantined = read_quarantine(stager.dir / "quarantine.jsonl")
    assert_exactly_once(items, cfg, n)  # every row checked: no bad content got through
    assert not tally.errors, tally.errors
    assert tally.lies >= cfg.ring.max_strikes and tally.refusals >= 1, tally
    counters = summary["counters"]
    assert counters["strikes"] == cfg.ring.max_strikes and counters["peers_banned"] == 1
    assert counters["skipped"] == 0
    assert quarantined == []


@pytest.mark.parametrize("lie", ["mel-too-long", "mel-ragged", "mel-past-the-field"])
def test_a_liars_mel_that_cannot_be_one_is_refused_and_no_item_pays(
    tmp_path: Path, lie: str
) -> None:
    """With stager mels a wave field may hold the clip's cached mel (marks MEL): one of
    more frames than its batch's bucket, or not whole frames of n_mels, is a lie like any
    wrong length: refused whole, a strike, never a charge on its item (the liar is this
    process on the ipc socket). So is a remote one's MEL where no mel fits (n_mels above
    hop_length: no producer sends one), whose copy into the spare once raised in the
    stager's loop, so that one peer ended the run. The honest producers hold a key of
    their own; every row is checked against its item's mel."""
    pytest.importorskip("torch")
    n = 120
    features: dict[str, Any] = {"device": "stager", "max_frames": 16, "n_mels": 8}
    remote = lie == "mel-past-the-field"
    if remote:
        features |= {"n_fft": 32, "win_length": 32, "hop_length": 6}
    cfg_path, keys = keyed(
        tmp_path,
        ("honest", "liar"),
        items=n,
        delay_s=0.005,
        features=features,
        devices={"stager_framework": "torch"},
        ring=ALL_REMOTE if remote else {},
    )
    stop = threading.Event()
    with stager_thread(cfg_path) as stager:
        cfg, client = stager.cfg, stager.client()
        assert cfg.schema.mels_fit_waves != remote
        where = (stager.tcp, str(keys["liar"])) if remote else (stager.control, "")
        thread, tally = in_thread(lie_per_grant, cfg, *where, stop, lie)
        wait_for(lambda: tally.refusals, 20, "the liar refused")
        items = []
        with producer_threads(cfg, stager.tcp, keys=load_client(keys["honest"])):
            while (batch := client.next(timeout_s=60)) is not None:
                items += check_stager_rows(batch, cfg)
                client.free(batch)
            client.close()
        stop.set()
        thread.join(5)
        summary = stager.summary()
        quarantined = read_quarantine(stager.dir / "quarantine.jsonl")
    assert items == plan_items(cfg, n)  # once each, in plan order
    assert not tally.errors, tally.errors
    assert tally.lies >= cfg.ring.max_strikes and tally.refusals >= 1, tally
    counters = summary["counters"]
    assert counters["strikes"] == cfg.ring.max_strikes and counters["peers_banned"] == 1
    assert summary["dropped"]["malformed"] == cfg.ring.max_strikes, summary["dropped"]
    assert counters["skipped"] == 0 and counters["mels_from_cache"] == 0
    assert quarantined == []


def test_three_bad_rows_of_a_run_of_64_go_back_alone_and_only_the_liar_pays(
    tmp_path: Path,
) -> None:
    """A local liar answers a run of 64 rows whole: one row torn, one holding a NaN, one a
    token id past the vocabulary. The stager reads each row once, where it lies, before
    the batch is sent: only those three positions are granted again (to the honest
    producers: a key of their own over tcp), the other 61 are delivered as written, the
    liar is struck once, and no item is quarantined."""
    n = 192
    cfg_path, keys = keyed(
        tmp_path,
        ("honest",),
        items=n,
        delay_s=0.002,
        stager={"batch_size": 64},
        producers={"credits": 128},
        ring={"audit_first": 0, "audit_fraction": 0.0, "lease_s": 5.0},
    )
    stop = threading.Event()
    with stager_thread(cfg_path) as stager:
        cfg, client = stager.cfg, stager.client()
        thread, tally = in_thread(three_bad_rows, cfg, stager.control, stop)
        wait_for(lambda: tally.lies, 20, "the liar's READY")
        with producer_threads(cfg, stager.tcp, keys=load_client(keys["honest"])):
            items = consume(client)
            client.close()
        stop.set()
        thread.join(5)
        summary = stager.summary()
        quarantined = read_quarantine(stager.dir / "quarantine.jsonl")
    assert not tally.errors, tally.errors
    assert_exactly_once(items, cfg, n)  # every row checked against its item
    counters, dropped = summary["counters"], summary["dropped"]
    assert counters["torn"] == 1 and dropped.get("bad-rows") == 2, (counters, dropped)
    assert counters["strikes"] == 1 and counters["peers_banned"] == 0, counters
    # Granted once each, but the three: nothing else of the liar's run went back.
    assert counters["grants"] == n + 3 + counters["backups"] + counters["reclaimed"], counters
    assert counters["skipped"] == 0 and quarantined == []


def test_bad_content_from_two_peers_quarantines_the_item(tmp_path: Path) -> None:
    """Case 5's other half: the same item's rows out of range from two peers (this
    process over ipc, and a key over tcp) is the item's fault, with a reason; the epoch
    is otherwise complete."""
    n = 60
    cfg_path, keys = keyed(tmp_path, ("liar", "honest"), items=n, delay_s=0.005)
    stop = threading.Event()
    with stager_thread(cfg_path) as stager, StatsReader(stager.stats) as stats:
        cfg, client = stager.cfg, stager.client()
        local, _ = in_thread(lie_per_grant, cfg, stager.control, "", stop, "content")
        far, _ = in_thread(lie_per_grant, cfg, stager.tcp, str(keys["liar"]), stop, "content")
        try:
            stats.first(lambda s: s["counters"].get("peers_banned") == 2, 30, "two bans")
            with producer_threads(cfg, stager.tcp, keys=load_client(keys["honest"])):
                items = consume(client)
                client.close()
        finally:
            stop.set()
            local.join(5)
            far.join(5)
        summary = stager.summary()
        skipped = read_quarantine(stager.dir / "quarantine.jsonl")
    assert skipped and all(r["stage"] == "content" for r in skipped), skipped
    assert all("two producers sent bad rows" in r["reason"] for r in skipped)
    bad = {int(r["item_id"].rsplit("-", 1)[1]) for r in skipped}
    assert sorted(items) == sorted(set(range(n)) - bad)  # each row checked, once each
    assert summary["counters"]["peers_banned"] == 2


def test_a_fast_liar_with_bad_checksums_is_banned(tmp_path: Path) -> None:
    """Case 2: a remote peer with a valid key answers every GRANT at once with a wrong
    checksum; the honest producer (50 ms a sample) still delivers the epoch."""
    n = 60
    cfg_path, keys = keyed(tmp_path, ("liar",), items=n, delay_s=0.05)
    stop = threading.Event()
    with stager_thread(cfg_path) as stager:
        cfg, client = stager.cfg, stager.client()
        thread, tally = in_thread(bad_checksums, cfg, stager.tcp, str(keys["liar"]), stop)
        wait_for(lambda: tally.joins, 20, "the liar joined")
        with producer_threads(cfg, stager.control):
            items = consume(client)
            client.close()
        stop.set()
        thread.join(5)
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)
    assert not tally.errors and tally.refusals >= 1, tally
    assert summary["counters"]["peers_banned"] == 1 and summary["counters"]["skipped"] == 0


def test_thirty_identities_of_one_key_get_one_peers_share(tmp_path: Path) -> None:
    """Case 3: one key, 30 identities that join, ask, heartbeat and never deliver. They
    hold no more than one peer's share, their positions go to the honest producers, and
    nothing is charged."""
    n = 200
    # Short leases: the run waits out the lease of each position an identity holds.
    ring = {"lease_s": 0.3, "heartbeat_s": 0.1}
    cfg_path, keys = keyed(tmp_path, ("liar",), items=n, delay_s=0.005, ring=ring)
    stop, held = threading.Event(), []
    with stager_thread(cfg_path) as stager, StatsReader(stager.stats) as stats:
        cfg, client = stager.cfg, stager.client()
        thread, tally = in_thread(silent_identities, cfg, stager.tcp, str(keys["liar"]), stop, 30)
        wait_for(lambda: tally.joins >= 30, 20, "30 identities joined")
        # Grants made while they were the only peer run out after a lease; from then on
        # fair share and their shrinking limit hold them.
        settled = time.monotonic() + 2 * cfg.ring.lease_s

        def sample(_: int) -> None:
            rows = stats.latest().get("producers", [])
            if time.monotonic() > settled:
                held.append(sum(r["grants"] for r in rows if r["name"].startswith("idle-")))

        with producer_threads(cfg, stager.control, n=2):
            items = consume(client, on_batch=sample)
            client.close()
        stop.set()
        thread.join(5)
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)
    assert not tally.errors and tally.lies >= 1, tally
    assert held and max(held) <= cfg.grants_in_flight // 2, held  # one of two peers' share
    assert summary["counters"]["skipped"] == 0
