"""Holding is charged like lying (issue 35, item 1), against the real stager in this
process with honest producers of another key: 30 identities of one key that join, take
grants, heartbeat and never deliver are struck for the leases that expire at them and
banned; identities that take grants and fall silent past the lease (each such lease
would charge its item) never get an innocent item quarantined, and are banned too. (An
honest link that loses messages is never struck: tests/process/test_faults.py.)"""

from __future__ import annotations

import threading
from pathlib import Path

from ringfeed.consumer.stager.peers import PeerId, PeerTrust
from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.shared.wire.keys import load_client
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import keyed
from tests.support.liars import in_thread, silent_holders, silent_identities
from tests.support.polling import wait_for
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread

RING = {"lease_s": 0.5, "heartbeat_s": 0.1}


def run_beside(
    tmp_path: Path, liar, *args: object, alone=lambda tally: tally.lies, until=lambda s: True
) -> tuple:
    """The liar (a strategy of tests/support/liars.py, with the key 'liar') alone until
    alone(its tally) says so, then beside two honest producers of their own key to the
    end of the plan, and on until until(the stager) says so; -> (cfg, items, tally,
    summary, quarantine)."""
    n = 300
    config, keys = keyed(tmp_path, ("honest", "liar"), items=n, delay_s=0.002, ring=RING)
    with stager_thread(config) as stager:
        cfg, client, stop = stager.cfg, stager.client(), threading.Event()
        thread, tally = in_thread(liar, cfg, stager.tcp, str(keys["liar"]), stop, *args)
        wait_for(lambda: alone(tally), 20, "the liar holding grants")
        with producer_threads(cfg, stager.tcp, n=2, keys=load_client(keys["honest"])):
            items = consume(client, timeout_s=90)
            wait_for(lambda: until(stager.stager), 20, "the stager's verdict on the liar")
            client.close()
        stop.set()
        thread.join(10)
        summary = stager.summary()
    assert not tally.errors, tally.errors
    assert_exactly_once(items, cfg, n)
    return cfg, items, tally, summary, read_quarantine(stager.dir / "quarantine.jsonl")


def test_thirty_mute_identities_of_one_key_are_struck_and_banned(tmp_path: Path) -> None:
    # Backups keep the honest producers going past what the mute ones hold (twins.py), so
    # the epoch may end before the ban: the run goes on until the key's messages are
    # dropped unread.
    banned_and_dropped = lambda s: s.drop.counts["banned-peer"] >= 1  # noqa: E731
    cfg, _, _, summary, quarantine = run_beside(
        tmp_path, silent_identities, 30, until=banned_and_dropped
    )
    assert summary["counters"]["peers_banned"] == 1, summary["counters"]
    assert summary["counters"]["strikes"] >= cfg.ring.max_strikes
    assert summary["dropped"].get("banned-peer", 0) >= 1  # read no more after the ban
    assert quarantine == []


def test_silent_holders_never_get_an_innocent_item_quarantined(tmp_path: Path) -> None:
    # Alone for three rounds of grants (each item it held could have been charged three
    # times), or until it is banned for holding: its HELLOs are then answered no more.
    _, _, tally, summary, quarantine = run_beside(
        tmp_path, silent_holders, 4, alone=lambda tally: tally.joins >= 16 or tally.refusals
    )
    assert quarantine == [], quarantine  # no 'lease expired 3 times' for their silence
    assert summary["counters"]["reclaimed"] >= 4  # their leases did run out
    assert summary["counters"]["peers_banned"] == 1  # holding, silent, is charged too


def test_a_peer_testifies_against_items_only_while_it_delivers() -> None:
    """Whose silent expiry charges an item: never a peer that has delivered nothing; one
    that delivers at least half as many samples as grants it let expire; and a holder is
    struck once it has held for 2 leases, at 10 expired grants with under a quarter as
    many samples, then at every grant more."""
    now = [0.0]
    trust = PeerTrust(max_strikes=3, n_slots=16, lease_s=1.0, clock=lambda: now[0])
    liar, honest = PeerId("key L", "key L"), PeerId("key H", "key H")
    assert trust.held_expired(liar, 4) == "" and not trust.testifies(liar)
    for _ in range(6):
        trust.delivered(honest)
    assert trust.held_expired(honest, 4) == "" and trust.testifies(honest)  # 6 >= 4 / 2
    assert trust.held_expired(honest, 9) == "" and not trust.testifies(honest)  # 6 < 13 / 2
    assert trust.held_expired(liar, 6) == ""  # 10, but within its first 2 leases
    now[0] = 2.0
    assert "10 of its grants expired, 0 samples delivered" in trust.held_expired(liar, 0)
    assert trust.held_expired(liar, 1) != ""  # and every grant more (HOLD_MORE_EXPIRIES)
    trust.held_expired(liar, 0)
    assert trust.held_expired(liar, 0) == ""  # no grant more, no strike more
