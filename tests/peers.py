"""What a test plays by hand against a live stager: a peer's socket, a stats subscriber,
a free tcp port for a stager to bind."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from ringfeed.shared.wire import protocol as p
from tests.polling import wait_for


@contextlib.contextmanager
def peer_socket(endpoint: str) -> Iterator[zmq.Socket]:
    """A DEALER connected to a stager's endpoint, for tests that play a peer by hand."""
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        yield sock


def free_port() -> int:
    """A tcp port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StatsReader:
    """Subscribes to the stager's stats stream (what the inspector reads)."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)

    def latest(self, timeout_s: float = 3.0) -> dict[str, Any]:
        """The newest stats snapshot: waits up to timeout_s for one, then skips to the last
        one queued."""
        wait_for(lambda: self.sock.poll(100), timeout_s, "stats from the stager", interval_s=0)
        while True:
            msg, _ = p.decode(self.sock.recv_multipart())
            if not self.sock.poll(0):
                return msg.data

    def first(
        self, holds: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
    ) -> dict[str, Any]:
        """The first snapshot from now on for which holds(snapshot) is true."""

        def snapshot_that_holds() -> dict[str, Any] | None:
            snap = self.latest()
            return snap if holds(snap) else None

        return wait_for(snapshot_that_holds, timeout_s, what)

    def close(self) -> None:
        """Close the socket, then its context (a context left to the garbage collector
        can block a later test in Context.term)."""
        self.sock.close()
        self.ctx.term()

    def __enter__(self) -> StatsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
