"""A producer stopped past its lease and then woken, played by hand against the real stager
in this process (its sockets and rings; tests/support/stager_thread.py) beside an honest
producer thread: nothing still queued in it is granted to another producer before the
stager told it to drop it (REHELLO). Real producers SIGSTOPped and woken:
tests/process/test_stopped_producers.py."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import zmq

from ringfeed.shared.config import Config
from ringfeed.shared.memory.ring import Ring, SlotState, shown_state
from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.wire import protocol as p
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.peers import peer_socket
from tests.support.polling import wait_for
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread


class WokenProducer:
    """Plays a local producer by hand: takes grants, goes silent past its lease, then
    READYs one place and watches whether its other, still queued, places are granted to
    someone else before the stager told it to drop them (REHELLO). A place is (batch slot
    or -1 for a spare, row or spare slot)."""

    def __init__(self, cfg: Config, endpoint: str, lease_s: float) -> None:
        self.cfg, self.endpoint, self.lease_s = cfg, endpoint, lease_s
        self.grants: set[tuple[int, int, int]] = set()  # (batch, place, generation)
        self.held: list[tuple[int, int, int]] = []
        self.regranted: list[tuple[tuple[int, int], int, int]] = []
        self.rehello: float | None = None

    def drain(self, sock: zmq.Socket, timeout_ms: int) -> list:
        out = []
        while sock.poll(timeout_ms):
            msg, _ = p.decode(sock.recv_multipart())
            out.append(msg)
            if isinstance(msg, p.Grant):
                self.grants.update((e.batch, e.place, e.generation) for e in msg.entries())
            if isinstance(msg, p.Rehello) and self.rehello is None:
                self.rehello = time.monotonic()
            timeout_ms = 0
        return out

    def run(self) -> None:
        with peer_socket(self.endpoint) as sock:
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
            (_, place0, gen0), queued = self.held[0], self.held[1:]
            k = len(self.cfg.sample_fields())
            wrong_item = 10**9  # not the item granted: the stager must revoke this producer
            ready = p.Ready(gen0, [place0], [wrong_item], [1] * k, [0], [0])
            sock.send_multipart(p.encode(ready))
            # Woken, a worker heartbeats on: if the READY itself revoked it (a stager too
            # busy to see the lease run out first), REHELLO answers this.
            sock.send_multipart(p.encode(p.Heartbeat(0, {})))
            rings = (
                Ring.attach(welcome.ring_name, writable=False),
                Ring.attach(welcome.spares, writable=False),
            )
            try:
                wait_for(lambda: self.settled(sock, rings, queued), 10, "REHELLO", interval_s=0)
            finally:
                for ring in rings:
                    ring.close()
            sock.send_multipart(p.encode(p.Bye(0, {})))

    def granted(self, sock: zmq.Socket, n: int) -> bool:
        """Read what the stager sent; True once it granted this producer n slots."""
        self.drain(sock, 100)
        return len(self.grants) >= n

    def settled(
        self, sock: zmq.Socket, rings: tuple[Ring, Ring], queued: list[tuple[int, int, int]]
    ) -> bool:
        """Read what the stager sent and record each queued place granted to another
        producer before any REHELLO; True once REHELLO came or all of them were."""
        self.drain(sock, 10)
        batches, spares = rings
        for batch, place, gen in queued:
            h = (
                spares.slots[place]
                if batch < 0
                else batches.rows[batch * batches.rows_per_slot + place]
            )
            g = int(h["generation"])
            live = shown_state(h) in (SlotState.GRANTED, SlotState.WRITING)
            mine = (batch, place, g) in self.grants
            seen = any((batch, place) == where for where, _, _ in self.regranted)
            if g != gen and live and not mine and self.rehello is None and not seen:
                self.regranted.append(((batch, place), gen, g))
        return self.rehello is not None or len(self.regranted) == len(queued)


def test_a_woken_producer_keeps_its_queued_grants_until_told_otherwise(tmp_path: Path) -> None:
    """A local producer stopped past its lease holds several grants in its queue (credits).

    When it speaks again its fenced slots are unfenced at once, but nothing tells it
    that the grants still queued in it are void: a real worker goes on to write them
    (producer/process/worker.py fills its queue in order). So none of those slots may be
    granted to another producer unless the stager first told this one to drop its
    grants (REHELLO). This test plays that producer by hand and watches the ring."""
    n, lease_s = 400, 1.0
    with stager_thread(
        small(tmp_path, items=n, delay_s=0.005, ring={"lease_s": lease_s})
    ) as stager:
        cfg, client = stager.cfg, stager.client()
        woken = WokenProducer(cfg, stager.control, lease_s)
        with producer_threads(cfg, stager.control):
            thread = threading.Thread(target=woken.run, daemon=True)
            thread.start()
            items = consume(client, timeout_s=30)
            thread.join(15)
            client.close()
        stager.summary()
    assert len(woken.held) >= 2, "the hand-played producer got too few grants"
    assert woken.rehello is not None, "the woken producer was never told to drop its grants"
    assert_exactly_once(items, cfg, n)
    assert woken.regranted == [], (
        f"slots still queued in the woken producer (slot, its generation, new generation) "
        f"were granted to another producer without a REHELLO: {woken.regranted}"
    )
