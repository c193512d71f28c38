"""A producer that heartbeats but never answers its grants, played by hand against the real
stager in this process (tests/support/stager_thread.py) beside honest producer threads:
its grants come back with the lease, and every row of the epoch arrives in plan order.
The other faults, with real processes: tests/process/test_faults.py."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from ringfeed.shared.run.fingerprint import config_fingerprint
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.keys import load_client
from tests.support.checks import consume, plan_items
from tests.support.configs import keyed
from tests.support.peers import peer_socket
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread


class MuteProducer(threading.Thread):
    """Says HELLO, asks for grants, then only heartbeats: never READY, never SKIP; until
    its stop event is set."""

    def __init__(self, endpoint: str, config: dict[str, str]) -> None:
        """config: the run's config fingerprint, which its HELLO must carry."""
        super().__init__(daemon=True)
        self.endpoint, self.config, self.grants, self.rehellos = endpoint, config, 0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        with peer_socket(self.endpoint) as sock:
            hello = p.Hello("mute", os.getpid(), socket.gethostname(), False, "t", "", self.config)
            sock.send_multipart(p.encode(hello))
            beat = 0.0
            while not self.stop.is_set():
                if sock.poll(50):
                    msg, _ = p.decode(sock.recv_multipart())
                    if isinstance(msg, p.Welcome):
                        sock.send_multipart(p.encode(p.Request(4)))
                    self.grants += isinstance(msg, p.Grant)
                    self.rehellos += isinstance(msg, p.Rehello)
                if time.monotonic() > beat:  # alive and well, as far as heartbeats go
                    sock.send_multipart(p.encode(p.Heartbeat(0, {})))
                    beat = time.monotonic() + 0.2


def test_grants_of_a_producer_that_heartbeats_but_never_answers_come_back(
    tmp_path: Path,
) -> None:
    """The mute producer is this process on the ipc socket; the honest producers hold a
    key of their own, so its expired grants cut its own share, not theirs."""
    n = 200
    cfg_path, keys = keyed(tmp_path, ("honest",), items=n, delay_s=0.003, ring={"lease_s": 0.5})
    with stager_thread(cfg_path) as stager:
        cfg = stager.cfg
        mute = MuteProducer(stager.control, config_fingerprint(cfg))
        mute.start()
        try:
            client = stager.client()
            with producer_threads(cfg, stager.tcp, n=2, keys=load_client(keys["honest"])):
                t0 = time.monotonic()
                items = consume(client, timeout_s=30)
                took_s = time.monotonic() - t0
                client.close()
            stager.summary()
        finally:
            mute.stop.set()
            mute.join(5)
    assert mute.grants >= 1 and mute.rehellos >= 1, "the mute producer was never caught"
    assert items == plan_items(cfg, n)  # exactly once, in plan order
    assert took_s < 25
