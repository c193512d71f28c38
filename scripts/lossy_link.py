"""A ZeroMQ hop that loses messages: fault injection for the tests and the soak.

    link = LossyLink(front_port, stager_port, drop=0.1); link.start()
    # remote producers connect to tcp://127.0.0.1:front_port instead of the stager
    link.stop.set()

Loopback only. It drops whole messages (a READY with its payload frames, a
GRANT, a HELLO), which is what a lossy network or a peer's full queue costs
ZeroMQ; leases and generations must make each such loss cost one lease.
"""

from __future__ import annotations

import random
import threading
import time

import zmq

# A peer silent this long has its connection to the stager closed, seconds.
IDLE_S = 10.0


class LossyLink(threading.Thread):
    """A ZeroMQ hop between remote producers and the stager that drops a fraction of the
    messages each way, whole (a READY with its payload frames, a GRANT, a HELLO). Each
    producer gets its own connection to the stager, as it would without the hop."""

    def __init__(self, front_port: int, back_port: int, drop: float, seed: int = 0) -> None:
        super().__init__(daemon=True)
        self.front_port, self.back_port, self.drop = front_port, back_port, drop
        self.rng, self.stop, self.dropped = random.Random(seed), threading.Event(), 0

    def run(self) -> None:
        with zmq.Context() as ctx:
            front = ctx.socket(zmq.ROUTER)
            front.setsockopt(zmq.LINGER, 0)
            front.bind(f"tcp://127.0.0.1:{self.front_port}")
            backs: dict[bytes, zmq.Socket] = {}
            heard: dict[bytes, float] = {}
            poller = zmq.Poller()
            poller.register(front, zmq.POLLIN)
            while not self.stop.is_set():
                for sock, _ in poller.poll(10):
                    if sock is front:
                        peer, *frames = front.recv_multipart()
                        if peer not in backs:
                            backs[peer] = ctx.socket(zmq.DEALER)
                            backs[peer].setsockopt(zmq.LINGER, 0)
                            backs[peer].connect(f"tcp://127.0.0.1:{self.back_port}")
                            poller.register(backs[peer], zmq.POLLIN)
                        heard[peer] = time.monotonic()
                        self.forward(backs[peer], frames)
                    else:
                        peer = next(k for k, v in backs.items() if v is sock)
                        self.forward(front, [peer, *sock.recv_multipart()])
                self.close_idle(backs, heard, poller)
            for sock in [front, *backs.values()]:
                sock.close()

    @staticmethod
    def close_idle(backs: dict, heard: dict, poller: zmq.Poller) -> None:
        """A producer silent this long is gone (a killed one reconnects under a new
        identity): close its connection, as its own socket's death would."""
        now = time.monotonic()
        for peer in [p for p, t in heard.items() if now - t > IDLE_S]:
            poller.unregister(backs[peer])
            backs.pop(peer).close()
            del heard[peer]

    def forward(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        if self.rng.random() < self.drop:
            self.dropped += 1
        else:
            sock.send_multipart(frames)
