"""The consumer end of the batch ring: what the trainer and the tf.data adapter use.

No TensorFlow here. :meth:`BatchClient.next` returns zero-copy views of one
batch-ring slot; the caller copies them (to its device) and then calls
:meth:`BatchClient.free` so the stager can refill the slot. With 3 batch
slots the stager fills one while the trainer copies another and a third
waits: triple buffering.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import numpy as np
import zmq

from shared import protocol as p
from shared.config import Config, endpoints
from shared.process import POLL_S, SHUTDOWN_WAIT_S
from shared.ring import Ring
from shared.sockets import make_socket, recv, send

log = logging.getLogger(__name__)

# How often an unanswered CONSUMER_HELLO is repeated (the stager may start later).
HELLO_RETRY_S = 1.0


class StagerGone(RuntimeError):
    """The stager stopped (SHUTDOWN) or never answered."""


@dataclass
class Batch:
    """One batch: views into the batch ring (valid until free()), plus its place in the plan."""

    slot: int
    generation: int
    batch_index: int
    next_position: int
    epoch: int
    n_valid: int
    arrays: dict[str, np.ndarray]


class BatchClient:
    """Connects to a run's stager as its one consumer, starting at plan `position`."""

    def __init__(
        self,
        cfg: Config,
        run_id: str,
        name: str = "trainer",
        position: int = 0,
        batch_index: int = 0,
    ) -> None:
        self.cfg, self.run_id, self.name = cfg, run_id, name
        self.ctx = zmq.Context()
        ident = f"{name}:{os.getpid()}:{time.monotonic_ns()}".encode()
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=ident)
        self.sock.connect(endpoints(cfg, run_id).control)
        self.ring: Ring | None = None
        self.hello = p.ConsumerHello(name, position, batch_index)
        self.ended = False
        self.dropped = 0

    def connect(self, timeout_s: float) -> None:
        """Say hello until the stager answers with the batch ring's name."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            send(self.sock, self.hello)
            msg = self._wait((p.Welcome,), HELLO_RETRY_S)
            if msg is not None:
                self.ring = Ring.attach(msg.ring_name)
                return
        raise StagerGone(
            f"no stager answered on {endpoints(self.cfg, self.run_id).control} within "
            f"{timeout_s:.0f} s: start it first (scripts/launch.sh does)"
        )

    def _wait(self, kinds: tuple[type, ...], timeout_s: float) -> p.Message | None:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(min(left, POLL_S) * 1000):
                if left <= 0:
                    return None
                continue
            try:
                _, msg, _ = recv(self.sock)
            except zmq.Again:
                continue
            except p.ProtocolError as exc:
                self.dropped += 1
                log.warning("dropped a malformed message from the stager: %s", exc)
                continue
            if isinstance(msg, p.Shutdown):
                raise StagerGone(f"the stager stopped: {msg.reason}")
            if isinstance(msg, kinds):
                return msg

    def next(self, timeout_s: float) -> Batch | None:
        """The next batch, or None at the end of a finite plan; raises TimeoutError."""
        if self.ended:
            return None
        msg = self._wait((p.BatchReady, p.EndOfData), timeout_s)
        if msg is None:
            raise TimeoutError(f"no batch from the stager within {timeout_s:.1f} s")
        if isinstance(msg, p.EndOfData):
            self.ended = True
            return None
        arrays = {name: self.ring.view(name)[msg.slot] for name in self.ring.fields}
        return Batch(
            msg.slot,
            msg.generation,
            msg.batch_index,
            msg.next_position,
            msg.epoch,
            msg.n_valid,
            arrays,
        )

    def free(self, batch: Batch) -> None:
        """The caller has copied the batch: the stager may refill its slot."""
        batch.arrays = {}
        send(self.sock, p.BatchFree(batch.slot, batch.generation))

    def step_stats(self, step: int, step_s: float, wait_s: float, loss: float) -> None:
        send(self.sock, p.StepStats(step, step_s, wait_s, loss))

    def close(self, finished: bool = True) -> None:
        """finished: tell the stager the run is over (it then stops the producers).
        Idempotent: a second call does nothing."""
        if self.sock.closed:
            return
        if finished:
            send(self.sock, p.Bye(0))
            try:
                self._wait((p.ByeAck,), SHUTDOWN_WAIT_S)
            except StagerGone:
                pass  # it is stopping anyway, which is what BYE asks for
        self.sock.close()
        if self.ring is not None:
            self.ring.close()
        self.ctx.term()
