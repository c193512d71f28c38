"""ZeroMQ sockets the ringfeed way: linger 0, bounded queues, protocol frames.

A message is the protocol header frame plus raw buffer frames. ROUTER sockets
prepend the peer identity; :func:`recv` splits it off and decodes the rest,
raising :class:`shared.wire.protocol.ProtocolError` for anything malformed.
"""

from __future__ import annotations

from typing import Any

import zmq

from ringfeed.shared.wire.protocol import Message, ProtocolError, decode, encode

# A payload frame may be as large as the largest slot field; anything bigger
# is refused by libzmq before it reaches Python (ZMQ_MAXMSGSIZE).
DEFAULT_MAX_MSG_BYTES = 64 * 2**20
# A connecting socket whose peer has not bound yet tries again after RECONNECT_MS,
# doubling up to RECONNECT_MAX_MS (libzmq's 100 ms, never longer than before). An ipc
# endpoint is this host's stager, started with its producers and client: there the
# interval stays RECONNECT_MS (see connect()).
RECONNECT_MS, RECONNECT_MAX_MS = 10, 100


def make_socket(
    ctx: zmq.Context, kind: int, identity: bytes | None = None, max_msg_bytes: int = 0
) -> zmq.Socket:
    """A socket with linger 0 (never hang on close) and a message-size cap."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes or DEFAULT_MAX_MSG_BYTES)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)
    if kind == zmq.ROUTER:
        # Tell us (EHOSTUNREACH) rather than silently drop a send to a gone peer.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    return sock


def connect(sock: zmq.Socket, endpoint: str) -> None:
    """Connect sock to endpoint. An ipc endpoint is tried every RECONNECT_MS until its
    stager binds: doubling, a producer or client started with the stager was at 80-100
    ms between tries when it bound, a sixth of a ~0.6 s first batch
    (benchmarks/first_batch.py); a failed connect to a missing socket file is one cheap
    system call. A tcp endpoint keeps the doubling: a host not up yet is not flooded."""
    if endpoint.startswith("ipc://"):
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MS)
    sock.connect(endpoint)


def send(
    sock: zmq.Socket, msg: Message, payload: list[Any] | None = None, ident: bytes | None = None
) -> bool:
    """Send without blocking; False if the peer is gone or its queue is full."""
    frames = encode(msg, payload)
    if ident is not None:
        frames = [ident, *frames]
    try:
        sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=len(frames) < 3)
    except (zmq.Again, zmq.error.ZMQError):
        return False
    return True


def recv(sock: zmq.Socket, routed: bool = False) -> tuple[bytes | None, Message, list[bytes]]:
    """Receive one message without blocking: (peer identity or None, message, payload).

    Raises zmq.Again when nothing is waiting and ProtocolError when it is malformed
    (with the sender's identity as its `peer`, so a peer of another version can be told).
    """
    frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=True)
    ident = None
    if routed:
        ident, frames = frames[0], frames[1:]
    try:
        msg, payload = decode(frames)
    except ProtocolError as exc:
        exc.peer = ident
        raise
    return ident, msg, payload
