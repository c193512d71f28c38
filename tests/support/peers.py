"""A peer's socket, for a test that plays a producer or a consumer by hand against a
live stager (tests/support/liars.py plays the lying ones)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import zmq


@contextlib.contextmanager
def peer_socket(endpoint: str) -> Iterator[zmq.Socket]:
    """A DEALER connected to a stager's endpoint, for tests that play a peer by hand."""
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        yield sock
