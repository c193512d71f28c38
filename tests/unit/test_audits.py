"""Audits (consumer/stager/audits.py, issue 35 item 6), against the real stager in this
process: what a remote producer says about an item is checked by a local producer
computing it again. Made-up content that passes every other check is never
delivered and costs its peer a strike; an honest remote producer passes; a remote peer
that skips everything gets no item quarantined; a run without a local producer gives
its audits up after a lease and delivers everything. Every row is checked against its
item."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

import pytest

from ringfeed.consumer.stager import audits
from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.shared.wire.keys import load_client
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import keyed
from tests.support.liars import in_thread, made_up, skips_all
from tests.support.polling import wait_for
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread

RING = {"lease_s": 0.5, "heartbeat_s": 0.1}


def beside_a_local_producer(tmp_path: Path, liar, *args: object, **sections: dict) -> tuple:
    """The liar (with the key 'liar') joins first and answers alone for two leases (its
    answers wait for an auditor), then an honest local producer (ipc: the auditor)
    delivers the epoch; sections: config sections' keys over tests/support/configs.py
    small's; -> (cfg, items, tally, summary, quarantine)."""
    n = 120
    config, keys = keyed(tmp_path, ("liar",), items=n, delay_s=0.002, ring=RING, **sections)
    with stager_thread(config) as stager:
        cfg, client, stop = stager.cfg, stager.client(), threading.Event()
        thread, tally = in_thread(liar, cfg, stager.tcp, str(keys["liar"]), stop, *args)
        wait_for(lambda: tally.lies, 20, "the liar answering grants")
        time.sleep(2 * cfg.ring.lease_s)  # the fault's duration: alone past a lease
        with producer_threads(cfg, stager.control):
            items = consume(client, timeout_s=60)
            client.close()
        stop.set()
        thread.join(10)
        summary = stager.summary()
    assert not tally.errors, tally.errors
    # Every row was checked against its item (consume): nothing made up got through.
    if sections:  # another plan (length buckets), whose order is not Shuffle's: each once
        assert collections.Counter(items) == collections.Counter(range(n))
    else:
        assert_exactly_once(items, cfg, n)
    return cfg, items, tally, summary, read_quarantine(stager.dir / "quarantine.jsonl")


@pytest.mark.parametrize("kind", ["another", "zeros", "outliers"])
def test_made_up_content_is_never_delivered_and_its_peer_is_banned(
    tmp_path: Path, kind: str
) -> None:
    cfg, _, _, summary, quarantine = beside_a_local_producer(tmp_path, made_up, kind)
    counters = summary["counters"]
    assert counters["audits_failed"] >= cfg.ring.max_strikes, counters
    assert counters["audits_passed"] == 0
    assert counters["peers_banned"] == 1
    assert summary["dropped"]["audit-failed"] == counters["audits_failed"]
    assert quarantine == []


def test_a_remote_ready_too_long_for_its_bucket_gets_no_item_quarantined(tmp_path: Path) -> None:
    """A remote READY longer than its item's length bucket claims more rows than its place
    holds (an honest producer skips such an item, and its SKIP is audited): it is refused
    whole, a strike. Taken at its word, it once had every item of a smaller bucket
    quarantined (106 of 200)."""
    buckets = {
        "stager": {"buckets": [32, 48, 64], "batch_size": 4},
        "data": {"synthetic_lengths": "ljspeech"},
    }
    _, _, tally, summary, quarantine = beside_a_local_producer(
        tmp_path, made_up, "too-long", **buckets
    )
    assert quarantine == [], quarantine
    counters = summary["counters"]
    assert counters["peers_banned"] == 1 and counters["skipped"] == 0, counters
    assert tally.lies >= counters["strikes"] >= 1


def test_a_remote_peer_that_skips_everything_gets_no_item_quarantined(tmp_path: Path) -> None:
    _, _, tally, summary, quarantine = beside_a_local_producer(tmp_path, skips_all)
    assert quarantine == [], quarantine  # every SKIP overruled by the local producer
    assert summary["counters"]["skips_overruled"] >= 1
    assert summary["counters"]["skipped"] == 0
    assert tally.lies >= summary["counters"]["skips_overruled"]
    # An overruled SKIP is no answer of its peer's: counted before it was checked, lies
    # shielded a peer from its strikes for holding (consumer/stager/peers.py held_expired).
    liar = [p for p in summary["producers"] if p["name"].startswith("skips-all")]
    assert liar and all(p["samples"] == 0 for p in liar), liar


def test_an_honest_remote_producer_passes_its_audits(tmp_path: Path) -> None:
    n = 120
    config, keys = keyed(tmp_path, ("honest",), items=n, delay_s=0.002, ring=RING)
    with stager_thread(config) as stager:
        cfg, client = stager.cfg, stager.client()
        far = producer_threads(cfg, stager.tcp, keys=load_client(keys["honest"]))
        with far, producer_threads(cfg, stager.control):
            items = consume(client, timeout_s=60)
            client.close()
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)
    counters = summary["counters"]
    assert counters["audits_failed"] == 0 and counters["strikes"] == 0, counters
    # Each audit the remote sample passed was delivered; it was audited until
    # ring.audit_first of them passed (fewer if the local producer did the rest).
    assert 1 <= counters["audits_passed"] <= counters["audits"]


def test_without_a_local_producer_audits_are_given_up_after_a_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audits, "AUDIT_GRACE_S", 1.0)  # 20 s: a pool starting, on any host
    n = 60
    config, keys = keyed(tmp_path, ("honest",), items=n, delay_s=0.002, ring=RING)
    with stager_thread(config) as stager:
        cfg, client = stager.cfg, stager.client()
        with producer_threads(cfg, stager.tcp, keys=load_client(keys["honest"])):
            items = consume(client, timeout_s=60)
            client.close()
        summary = stager.summary()
    assert_exactly_once(items, cfg, n)
    counters = summary["counters"]
    assert counters["audits_unanswered"] >= 1 and counters["audits_passed"] == 0, counters
    assert "are not audited until one delivers" in stager.log.text()


def test_without_a_local_producer_a_remote_skip_is_believed_only_from_a_second_peer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No local producer to check: a remote SKIP is doubted and the item tried again at
    another peer (an honest remote one here), so a peer that skips everything still
    gets no item quarantined."""
    monkeypatch.setattr(audits, "AUDIT_GRACE_S", 1.0)
    n = 120
    config, keys = keyed(tmp_path, ("liar", "honest"), items=n, delay_s=0.002, ring=RING)
    with stager_thread(config) as stager:
        cfg, client, stop = stager.cfg, stager.client(), threading.Event()
        thread, tally = in_thread(skips_all, cfg, stager.tcp, str(keys["liar"]), stop)
        wait_for(lambda: tally.lies, 20, "the liar answering grants")
        with producer_threads(cfg, stager.tcp, keys=load_client(keys["honest"])):
            items = consume(client, timeout_s=60)
            client.close()
        stop.set()
        thread.join(10)
        summary = stager.summary()
        quarantine = read_quarantine(stager.dir / "quarantine.jsonl")
    assert_exactly_once(items, cfg, n)
    assert quarantine == [], quarantine
    assert summary["counters"]["skips_doubted"] >= 1, summary["counters"]
