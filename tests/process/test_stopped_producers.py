"""Producers stopped past their lease (SIGSTOPped, or hand-played and silent) and then
woken: their slots are FENCED while they may still write, whatever they send late is
stale, and nothing still queued in them is granted to another producer before the
stager told them to drop it (REHELLO).

Real stager and producer processes; the test process is the consumer and checks
every row, the epoch exactly once, and the stager's memory across the fault.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from ringfeed.scripts.runner import worker_pids
from ringfeed.shared.config import Config, load_config
from ringfeed.shared.config.environment import endpoints
from ringfeed.shared.memory.ring import Ring, SlotState, shown_state
from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.wire import protocol as p
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.peers import peer_socket
from tests.support.polling import wait_for
from tests.support.processes import RSS_SLACK_KB, rss_kb, send_signal
from tests.support.runs import Run, finish, rid
from tests.support.stats import StatsReader

pytestmark = pytest.mark.slow


N_ITEMS, LEASE_S = 400, 1.0


def stopped_configs(tmp_path: Path, patience_s: float) -> tuple[Path, Path]:
    """The run's config (the stager's lease: LEASE_S) and its local pool's, whose
    ring.lease_s is the producers' patience: how long a producer waits for word from
    the stager before it says HELLO again on a new socket."""
    # credits 4: a READY leaves after each sample, so the woken producer announces the
    # slot it was writing when stopped at once.
    over = {"producers": {"workers": 2, "credits": 4}}
    run_cfg = small(tmp_path, items=N_ITEMS, delay_s=0.01, ring={"lease_s": LEASE_S}, **over)
    (tmp_path / "pool").mkdir()
    patient = {"lease_s": patience_s}
    orphan = {**over["producers"], "orphan_s": max(30.0, 3 * patience_s)}
    pool_cfg = small(tmp_path / "pool", items=N_ITEMS, delay_s=0.01, ring=patient,
                     producers=orphan)  # fmt: skip
    return run_cfg, pool_cfg


def wake_when_fenced(stats: StatsReader, pid: int, seen: dict[str, Any]) -> None:
    """Beside the consumer: SIGCONT the stopped pid once its slots show FENCED (kept in
    seen["fenced"]) and it has been stopped (since seen["stopped_at"]) 2.5 leases."""
    try:
        fenced = stats.first(lambda s: s["slots"].get("FENCED", 0), 10, "FENCED slots")
        seen["fenced"] = fenced["slots"]["FENCED"]
        # The fault: silent past the stager's lease and past its own patience.
        time.sleep(max(0.0, seen["stopped_at"] + 2.5 * LEASE_S - time.monotonic()))
    finally:
        send_signal(pid, signal.SIGCONT)


def stop_a_producer_past_its_lease(tmp_path: Path, patience_s: float) -> dict[str, Any]:
    """SIGSTOP one of two producers mid-epoch; SIGCONT it once its slots are FENCED and
    2.5 leases passed. Returns what was seen, with seen["summary"] = stager.json."""
    cfg_path, pool_cfg = stopped_configs(tmp_path, patience_s)
    cfg = load_config(cfg_path)
    run_id, seen, stopped = rid(), {"fenced": 0}, []
    with (
        Run(cfg_path, run_id, tmp_path) as run,
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        stager = run.start("stager")
        run.config = pool_cfg
        pool = run.start("producers")
        run.config = cfg_path
        client = run.client(timeout_s=30)
        waker = threading.Thread(
            target=lambda: wake_when_fenced(stats, stopped[0], seen), daemon=True
        )

        def stop_one(n_items: int) -> None:
            if n_items >= 40 and not stopped:
                stopped.append(worker_pids(pool.pid)[0])
                seen["rss0"] = rss_kb(stager.pid)
                os.kill(stopped[0], signal.SIGSTOP)
                seen["stopped_at"] = time.monotonic()
                waker.start()

        try:
            seen["items"] = consume(client, on_batch=stop_one, timeout_s=30)
            waker.join(15)
            seen["rss1"] = rss_kb(stager.pid)
        finally:
            for pid in stopped:
                send_signal(pid, signal.SIGCONT)
            client.close()
        seen["summary"] = finish(run, run_id, "producers")
    assert_exactly_once(seen["items"], cfg, N_ITEMS)  # consume() also checked every row
    assert seen["fenced"] >= 1, "the stopped producer's slots were never FENCED"
    assert seen["summary"]["counters"]["reclaimed"] >= 1
    assert seen["rss1"] - seen["rss0"] < RSS_SLACK_KB
    return seen


def test_stopped_producer_is_fenced_and_its_late_ready_dropped(tmp_path: Path) -> None:
    # A patient producer keeps its socket, so its late READY reaches the stager and is
    # dropped as stale; or, woken before it wrote, it sees its grant's generation moved
    # on in the slot header and drops the grant itself (it reports that in heartbeats).
    seen = stop_a_producer_past_its_lease(tmp_path, patience_s=30.0)
    summary = seen["summary"]
    dropped_itself = sum(p["work"].get("taken_back", 0) for p in summary["producers"])
    assert summary["dropped"].get("stale", 0) + dropped_itself >= 1, summary
    assert summary["slots"].get("FENCED", 0) == 0, summary["slots"]


def test_stopped_producer_that_says_hello_again_gets_its_fenced_slots_back(
    tmp_path: Path,
) -> None:
    # Same patience as the stager's lease: on waking, the producer drops its grants and
    # says HELLO again from the same pid. It can no longer write the slots fenced under
    # its old identity, so they must return to FREE, not stay fenced until it dies.
    seen = stop_a_producer_past_its_lease(tmp_path, patience_s=1.0)
    summary = seen["summary"]
    assert summary["slots"].get("FENCED", 0) == 0, summary["slots"]


class WokenProducer:
    """Plays a local producer by hand: takes grants, goes silent past its lease, then
    READYs one slot and watches whether its other, still queued, slots are granted to
    someone else before the stager told it to drop them (REHELLO)."""

    def __init__(self, cfg: Config, run_id: str, lease_s: float) -> None:
        self.cfg, self.run_id, self.lease_s = cfg, run_id, lease_s
        self.grants: set[tuple[int, int]] = set()
        self.held: list[tuple[int, int]] = []
        self.regranted: list[tuple[int, int, int]] = []
        self.rehello: float | None = None

    def drain(self, sock: zmq.Socket, timeout_ms: int) -> list:
        out = []
        while sock.poll(timeout_ms):
            msg, _ = p.decode(sock.recv_multipart())
            out.append(msg)
            if isinstance(msg, p.Grant):
                self.grants.update(zip(msg.slots, msg.generations, strict=True))
            if isinstance(msg, p.Rehello) and self.rehello is None:
                self.rehello = time.monotonic()
            timeout_ms = 0
        return out

    def run(self) -> None:
        with peer_socket(endpoints(self.cfg, self.run_id).control) as sock:
            me = socket.gethostname()
            sock.send_multipart(
                p.encode(
                    p.Hello("woken", os.getpid(), me, False, "t", "", config_fingerprint(self.cfg))
                )
            )
            welcome = next(m for m in self.drain(sock, 5000) if isinstance(m, p.Welcome))
            sock.send_multipart(p.encode(p.Request(4)))
            wait_for(lambda: self.granted(sock, 2), 10, "two grants", interval_s=0)
            self.held = sorted(self.grants)
            time.sleep(2.0 * self.lease_s)  # the fault: silent past the lease, as if SIGSTOPped
            (slot0, gen0), queued = self.held[0], self.held[1:]
            k = len(self.cfg.sample_fields())
            wrong_item = 10**9  # not the item granted: the stager must revoke this producer
            sock.send_multipart(p.encode(p.Ready([slot0], [gen0], [wrong_item], [1] * k, [0], [0])))
            # Woken, a worker heartbeats on: if the READY itself revoked it (a stager too
            # busy to see the lease run out first), REHELLO answers this.
            sock.send_multipart(p.encode(p.Heartbeat(0, {})))
            ring = Ring.attach(welcome.ring_name, writable=False)
            try:
                wait_for(lambda: self.settled(sock, ring, queued), 10, "REHELLO", interval_s=0)
            finally:
                ring.close()
            sock.send_multipart(p.encode(p.Bye(0, {})))

    def granted(self, sock: zmq.Socket, n: int) -> bool:
        """Read what the stager sent; True once it granted this producer n slots."""
        self.drain(sock, 100)
        return len(self.grants) >= n

    def settled(self, sock: zmq.Socket, ring: Ring, queued: list[tuple[int, int]]) -> bool:
        """Read what the stager sent and record each queued slot granted to another
        producer before any REHELLO; True once REHELLO came or all of them were."""
        self.drain(sock, 10)
        for slot, gen in queued:
            h = ring.slots[slot]
            g = int(h["generation"])
            live = shown_state(h) in (SlotState.GRANTED, SlotState.WRITING)
            mine = (slot, g) in self.grants
            seen = any(slot == s for s, _, _ in self.regranted)
            if g > gen + 1 and live and not mine and self.rehello is None and not seen:
                self.regranted.append((slot, gen, g))
        return self.rehello is not None or len(self.regranted) == len(queued)


def test_a_woken_producer_keeps_its_queued_grants_until_told_otherwise(tmp_path: Path) -> None:
    """A local producer stopped past its lease holds several grants in its queue (credits).

    When it speaks again its fenced slots are unfenced at once, but nothing tells it
    that the grants still queued in it are void: a real worker goes on to write them
    (producer/worker.py fills its queue in order). So none of those slots may be
    granted to another producer unless the stager first told this one to drop its
    grants (REHELLO). This test plays that producer by hand and watches the ring."""
    n, lease_s = 400, 1.0
    cfg_path = small(
        tmp_path, items=n, delay_s=0.005, ring={"lease_s": lease_s}, producers={"workers": 1}
    )
    cfg = load_config(cfg_path)
    run_id = rid()
    woken = WokenProducer(cfg, run_id, lease_s)
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        client = run.client(timeout_s=30)
        thread = threading.Thread(target=woken.run, daemon=True)
        thread.start()
        try:
            items = consume(client, timeout_s=30)
            thread.join(15)
        finally:
            client.close()
        finish(run, run_id, "producers")
    assert len(woken.held) >= 2, "the hand-played producer got too few grants"
    assert woken.rehello is not None, "the woken producer was never told to drop its grants"
    assert_exactly_once(items, cfg, n)
    assert woken.regranted == [], (
        f"slots still queued in the woken producer (slot, its generation, new generation) "
        f"were granted to another producer without a REHELLO: {woken.regranted}"
    )
