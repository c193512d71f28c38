"""The stager's sockets: control on ipc, remote producers on tcp, stats on PUB.

Local producers and the trainer talk to the ipc ROUTER. With
``transport.kind: tcp`` a second ROUTER binds host:port for producers on
other hosts; with ``transport.keys_dir`` it is a CURVE server and this module
answers ZeroMQ's ZAP requests itself, so a producer whose public key is not
listed never completes the handshake and each refusal is logged and counted.
Replies go back on the socket a peer came from. Called only by the stager.
A peer of another protocol version is answered REFUSED, naming both versions.

Peers are told apart by socket as well as by identity: the identities this
module hands out start with LOCAL or REMOTE, so a peer on the tcp socket can
never pass for one on the ipc socket (a peer chooses its own ZeroMQ identity,
and two sockets may well see the same one). Only the ipc socket, in a
directory only this user can enter (shared.config.runtime_dir), can be the
consumer's or a local producer's.

Memory per peer is bounded: no frame over ZMQ_MAXMSGSIZE (a sample's largest
field, or a control header if larger) reaches Python, and at most
REMOTE_RCVHWM messages of at most MAX_PAYLOAD_FRAMES + 1 frames wait per
remote peer.

Undecodable traffic is charged to whoever sent it (the identity frame names its key
or its process: consumer/stager/peers.py): each one is counted against its peer,
MALFORMED_PER_STRIKE of them are a strike, and once the peer is banned a remote one's
messages are dropped here unread (no copy, no decode) and its key fails the CURVE
handshake from then on. A flood of 52,000 undecodable messages from one key once cost
the stager 40 s of CPU and its honest producers 90 % of their delivery (issue 35).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import zmq
import zmq.utils.z85

from ringfeed.consumer.stager.peers import PeerId, peer_of
from ringfeed.shared.config import Config
from ringfeed.shared.config.environment import Endpoints
from ringfeed.shared.run.stats_record import ControlStats
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.keys import load_server
from ringfeed.shared.wire.sockets import make_socket, send

log = logging.getLogger(__name__)

# Messages read from one socket per poll before the stager grants and delivers again.
MAX_MESSAGES_PER_TURN = 256
# The first byte of every identity the stager sees: which socket the peer is on.
LOCAL, REMOTE = b"L", b"R"
# Messages queued per remote peer at most (a READY with its payload is one message, up to
# MAX_READY_PAYLOAD_BYTES: 64 MiB a peer at most).
REMOTE_RCVHWM = 16


class Incoming(NamedTuple):
    ident: bytes
    msg: p.Message
    payload: list[bytes]
    peer: PeerId | None  # for a HELLO or a CONSUMER_HELLO: who sent it


def is_remote(ident: bytes) -> bool:
    """Did this peer (an identity from ControlSockets.receive) come over tcp?"""
    return ident[:1] == REMOTE


def rest_of_message(sock: zmq.Socket) -> list[bytes]:
    """The frames after one just received (what recv_multipart would have added)."""
    frames = []
    while sock.getsockopt(zmq.RCVMORE):
        frames.append(sock.recv(copy=True))
    return frames


def version_refusal(exc: p.VersionMismatch) -> p.Refused:
    """What a peer of another protocol version is told (a REFUSED decodes in any version:
    shared/wire/protocol.py), one answer per message it sends."""
    return p.Refused(
        f"this stager speaks ringfeed protocol version {exc.ours}, the peer version "
        f"{str(exc.theirs)[:20]}: run the same ringfeed version on every host"
    )


ZAP_ENDPOINT = "inproc://zeromq.zap.01"
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class ControlSockets:
    """Bound on construction; :meth:`close` is idempotent."""

    def __init__(
        self,
        cfg: Config,
        endpoints: Endpoints,
        on_malformed: Callable[[str, bytes, PeerId], None],
        max_frame_bytes: int = p.MAX_HEADER_BYTES,
        on_banned: Callable[[str], None] = lambda _: None,
    ):
        """on_malformed(why, identity, peer): an undecodable message and who sent it;
        on_banned(detail): a banned remote peer's message, dropped unread;
        max_frame_bytes: the largest frame a remote producer may send (a slot's
        largest field); local peers send control headers only."""
        self.cfg, self.endpoints, self.on_malformed = cfg, endpoints, on_malformed
        self.on_banned = on_banned
        self.max_frame_bytes = max(max_frame_bytes, p.MAX_HEADER_BYTES)
        self.ctx = zmq.Context()
        self.poller = zmq.Poller()
        self.authorized: frozenset[bytes] = frozenset()
        self.refused = 0
        self.refused_by: collections.Counter[str] = collections.Counter()  # kind -> count
        # Ban key -> why: the stager's banned peers (PeerTrust.banned, set by build()).
        self.bans: Mapping[str, str] = {}
        self.remote: zmq.Socket | None = None
        self.zap: zmq.Socket | None = None
        self.monitor: zmq.Socket | None = None
        self.local = make_socket(self.ctx, zmq.ROUTER, max_msg_bytes=self.max_frame_bytes)
        self.local.bind(endpoints.control)
        self.poller.register(self.local, zmq.POLLIN)
        self.pub = make_socket(self.ctx, zmq.PUB)
        self.pub.bind(endpoints.stats)
        if endpoints.remote:
            self._bind_remote(endpoints.remote)

    def _bind_remote(self, endpoint: str) -> None:
        t = self.cfg.transport
        self.remote = make_socket(self.ctx, zmq.ROUTER, max_msg_bytes=self.max_frame_bytes)
        self.remote.setsockopt(zmq.RCVHWM, REMOTE_RCVHWM)
        if t.keys_dir:
            keys = load_server(Path(t.keys_dir))
            self.authorized = keys.authorized
            self.zap = make_socket(self.ctx, zmq.REP)
            self.zap.bind(ZAP_ENDPOINT)  # before any CURVE socket binds
            self.poller.register(self.zap, zmq.POLLIN)
            self.remote.curve_server = True
            self.remote.curve_publickey, self.remote.curve_secretkey = keys.public, keys.secret
            self.remote.zap_domain = b"ringfeed"
        self.remote.bind(endpoint)
        self.poller.register(self.remote, zmq.POLLIN)
        if t.keys_dir:
            # A peer with the wrong server key fails before ZAP is asked: watch for that too.
            self.monitor = self.remote.get_monitor_socket(HANDSHAKE_FAILED)
            self.poller.register(self.monitor, zmq.POLLIN)
        auth = f"CURVE, {len(self.authorized)} producer keys" if t.keys_dir else "no auth"
        log.info("remote producers connect to %s (%s)", endpoint, auth)

    def _refuse(self, peer: str, why: str, kind: str) -> None:
        """Count a refused connection; log the first few of each kind (a refused peer
        retries every few ms: one kind's lines must not crowd out another's)."""
        self.refused += 1
        self.refused_by[kind] += 1
        n = self.refused_by[kind]
        if n <= 3 or n % 100 == 0:
            log.warning(
                "refused a producer from %s: %s (%d so far); see docs/scaling-out.md",
                peer,
                why,
                n,
            )

    def _watch_handshakes(self) -> None:
        # Imported here: zmq.utils.monitor imports asyncio (~35 ms of every stager's start,
        # benchmarks/first_batch.py), and only a CURVE remote endpoint has a monitor.
        from zmq.utils.monitor import recv_monitor_message

        monitor = self.monitor
        assert monitor is not None
        while monitor.poll(0):
            event = recv_monitor_message(monitor)
            if event["event"] & HANDSHAKE_FAILED:
                why = "CURVE handshake failed (wrong server key?)"
                self._refuse("a tcp peer", why, "handshake")

    def _authenticate(self) -> None:
        """Answer ZAP requests: only listed producer keys complete the handshake."""
        zap = self.zap
        assert zap is not None
        while True:
            try:
                frames = zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            version, request_id, _domain, address, _identity, mechanism = frames[:6]
            key = frames[6] if len(frames) > 6 else b""
            ok = mechanism == b"CURVE" and key in self.authorized
            shown = zmq.utils.z85.encode(key).decode() if len(key) == 32 else "(none)"
            if not ok:
                where = f"{self.cfg.transport.keys_dir}/authorized"
                self._refuse(
                    address.decode(errors="replace"),
                    f"key {shown} is not in {where}",
                    "unknown key",
                )
            elif f"key {shown}" in self.bans:  # banned for the run: it connects no more
                ok = False
                self._refuse(address.decode(errors="replace"), f"key {shown} is banned", "banned")
            # The user id names the key in every message's metadata (consumer/stager/peers.py).
            user = zmq.utils.z85.encode(key) if ok else b""
            status = [b"200", b"OK"] if ok else [b"400", b"unknown producer key"]
            zap.send_multipart([version, request_id, *status, user, b""])

    def receive(self, timeout_s: float) -> Iterator[Incoming]:
        """Messages waiting now (after up to timeout_s); malformed ones are reported.
        A HELLO or CONSUMER_HELLO comes with who sent it (peer); others with None."""
        ready = dict(self.poller.poll(round(timeout_s * 1000)))
        if self.zap is not None and self.zap in ready:
            self._authenticate()
        if self.monitor is not None and self.monitor in ready:
            self._watch_handshakes()
        for sock, tag in ((self.local, LOCAL), (self.remote, REMOTE)):
            if sock is None or sock not in ready:
                continue
            for _ in range(MAX_MESSAGES_PER_TURN):
                try:
                    first = sock.recv(zmq.NOBLOCK, copy=False)  # the identity, with metadata
                    if tag == REMOTE and self.bans and self._banned(first, sock):
                        continue
                    msg, payload = p.decode(rest_of_message(sock))
                except zmq.Again:
                    break
                except p.ProtocolError as exc:
                    self.on_malformed(str(exc), tag + first.bytes, peer_of(first, tag == REMOTE))
                    if isinstance(exc, p.VersionMismatch):
                        self.reply(tag + first.bytes, version_refusal(exc))
                    continue
                hello = isinstance(msg, (p.Hello, p.ConsumerHello))
                peer = peer_of(first, tag == REMOTE) if hello else None
                yield Incoming(tag + first.bytes, msg, payload, peer)

    def _banned(self, first: zmq.Frame, sock: zmq.Socket) -> bool:
        """Is the remote peer of this identity frame banned? Then its message's other
        frames are read and dropped uncopied, and counted."""
        ban = peer_of(first, True).ban
        if ban not in self.bans:
            return False
        while sock.getsockopt(zmq.RCVMORE):
            sock.recv(copy=False)
        self.on_banned(f"a message of {ban}, unread")
        return True

    def reply(self, ident: bytes, msg: p.Message) -> bool:
        """Send to a peer on the socket it came from (never blocks); False if not sent."""
        sock = self.remote if is_remote(ident) else self.local
        return sock is not None and send(sock, msg, ident=ident[1:])

    def publish(self, msg: p.Message) -> None:
        send(self.pub, msg)

    def stats(self) -> ControlStats:
        """Its part of the stager's stats: producers refused at the handshake."""
        return ControlStats(self.refused)

    def close(self) -> None:
        """Close every socket and remove the ipc socket files (libzmq leaves them)."""
        if self.monitor is not None and self.remote is not None:
            self.remote.disable_monitor()
        for sock in (self.local, self.remote, self.zap, self.monitor, self.pub):
            if sock is not None and not sock.closed:
                sock.close()
        self.ctx.term()
        for endpoint in (self.endpoints.control, self.endpoints.stats):
            Path(endpoint.removeprefix("ipc://")).unlink(missing_ok=True)
