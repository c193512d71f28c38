"""The stager's stats stream as a test reads it (what the inspector reads)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from ringfeed.shared.wire import protocol as p
from tests.support.polling import wait_for


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
        """The first snapshot from now on for which holds(snapshot) is true (within
        timeout_s, however long the stager takes to publish its first: its start on a
        loaded machine took over 3 s)."""

        def snapshot_that_holds() -> dict[str, Any] | None:
            if not self.sock.poll(100):
                return None
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
