"""The consumer end of the batch ring: what the trainers, the loaders and the tf.data
adapter use.

No framework here. :meth:`BatchClient.next` returns zero-copy views of one
batch-ring slot; the caller copies them (to its device) and then calls
:meth:`BatchClient.free` so the stager can refill the slot. With 3 batch
slots the stager fills one while the trainer copies another and a third
waits: triple buffering.

A client given a `pin` (RingPin: the PyTorch and JAX loaders', consumer/client/host_pin.py)
has each mapping of the ring pinned once, right after it maps it, and unpinned before
it unmaps it (a restarted stager's new ring, close): a copy to the device can then read
the slot itself, and the caller frees the slot once that copy has ended.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import zmq

from ringfeed.shared.config import Config
from ringfeed.shared.config.environment import endpoints, run_dir
from ringfeed.shared.memory.batch_ring import batch_views
from ringfeed.shared.memory.ring import Ring
from ringfeed.shared.memory.segments import pid_alive
from ringfeed.shared.run.process import BYE_AGAIN_S, POLL_S, SHUTDOWN_WAIT_S
from ringfeed.shared.run.run_clock import RunClock
from ringfeed.shared.run.run_secret import (
    consumer_identity,
    find_run_dir,
    live_runs,
    read_consumer_secret,
    run_record,
    run_starting,
)
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.sockets import connect, make_socket, recv, send

log = logging.getLogger(__name__)

# While a consumer waits for a batch, it says so this often, seconds.
WAITING_NOTE_S = 60.0
# A wait's loop turns every POLL_S: a gap this long between two turns is time this
# process did not run (SIGSTOP, a debugger's breakpoint, a suspended VM), which no wait
# for a batch counts: after it, the batches sent meanwhile are read first.
PAUSED_S = 1.0
# Past this many times train.data_timeout_s without a batch, the wait ends whatever
# its pauses (a feeding thread whose every turn is that slow: the GIL held elsewhere).
PAUSED_LIMIT_FACTOR = 3

# How often an unanswered CONSUMER_HELLO is repeated (the stager may start later).
HELLO_RETRY_S = 1.0
# How often a client started with its stager looks for the stager's secret: POLL_S (50
# ms) was a tenth of a ~0.5 s first batch (benchmarks/first_batch.py); a stat is cheap.
SECRET_POLL_S = 0.01
# How long a client waits before it asks whether anyone runs or starts its run (a
# mistyped run id used to wait out connect's whole timeout, 60 s), and how often after.
KNOWN_RUN_S = 2.0


class StagerGone(RuntimeError):
    """The stager stopped (SHUTDOWN) or never answered."""


class StagerRefused(StagerGone):
    """The stager will not take this consumer (REFUSED): the message says why."""


class RingPin(Protocol):
    """Pins a mapped batch ring in place for copies to a device (host_pin.py HostPin)."""

    def pin(self, address: int, nbytes: int) -> None:
        """The mapping's slots, [address, address + nbytes), just mapped."""

    def unpin(self, address: int) -> None:
        """The span pinned at `address`, about to be unmapped."""


def slots_span(ring: Ring) -> tuple[int, int]:
    """(address, bytes) of a mapped ring's slots, in whole pages: what a copy out of a
    slot reads (the slots start on a page; a mapping is whole pages)."""
    starts, ends = [], []
    for name in ring.fields:
        view = ring.view(name)  # [n_slots, *shape], one slot every strides[0] bytes
        start = view.ctypes.data
        starts.append(start)
        ends.append(start + (view.shape[0] - 1) * view.strides[0] + view[0].nbytes)
    if not starts:
        return 0, 0
    low = min(starts) // mmap.PAGESIZE * mmap.PAGESIZE
    high = -(-max(ends) // mmap.PAGESIZE) * mmap.PAGESIZE
    return low, high - low


@dataclass
class Batch:
    """One batch: views into the batch ring (valid until free()), and `meta`, the stager's
    BATCH_READY: its slot, its place in the plan, its valid rows and shape."""

    meta: p.BatchReady
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
        plan: dict[str, str] | None = None,
        new_plan_at: int = 0,
        rejoin: bool = False,
        pin: RingPin | None = None,
    ) -> None:
        """plan: the plan fingerprint of the checkpoint it resumes (None: a fresh start);
        new_plan_at: if that plan changed, start a new one at this epoch (0: be refused);
        rejoin: take the run over from a live consumer of this same process (one made
        here earlier and dropped); without it that one keeps the run and connect()
        raises StagerRefused: one consumer means one socket; pin: pins each mapping of
        the ring for the caller's copies to its device (None: none is pinned)."""
        self.cfg, self.run_id, self.name, self.rejoin = cfg, run_id, name, rejoin
        self.pin, self._pinned_at = pin, 0
        self.plan, self.new_plan_at = dict(plan or {}), new_plan_at
        self.ctx = zmq.Context()
        ident = consumer_identity(name, os.getpid(), time.monotonic_ns())
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=ident)
        connect(self.sock, endpoints(cfg, run_id).control)
        self.ring: Ring | None = None
        self.stager_pid = 0  # the pid of the stager that welcomed this client
        self.position, self.batch_index = position, batch_index
        self.configured_dir = run_dir(cfg, run_id).absolute()  # run_root: from the cwd
        self.run_dir = self.configured_dir
        self.ended = False
        self.dropped = 0
        self.n_items = 0  # plan positions per epoch, from the WELCOME

    def connect(self, timeout_s: float, stop: Callable[[], bool] = lambda: False) -> None:
        """Say hello until the stager answers with the batch ring's name; raises
        StagerGone after timeout_s, or at once when stop() says so (a signal)."""
        deadline = time.monotonic() + timeout_s
        ask_at = time.monotonic() + KNOWN_RUN_S
        while time.monotonic() < deadline and not stop():
            if time.monotonic() > ask_at:  # a run nobody starts: say so now
                ask_at = time.monotonic() + KNOWN_RUN_S
                if find_run_dir(self.run_id) is None and not run_starting(self.run_id):
                    raise StagerGone(self.no_run())
            hello = self.hello(self.rejoin)
            if not hello.secret:  # the stager writes it before it binds: not started yet
                time.sleep(SECRET_POLL_S)
                continue
            send(self.sock, hello)
            msg = self._wait((p.Welcome,), HELLO_RETRY_S)
            if msg is not None:
                self._attach(msg)
                return
        if stop():
            raise StagerGone("stopped before the stager answered")
        raise StagerGone(self.no_stager(timeout_s))

    def no_stager(self, timeout_s: float) -> str:
        """Why no stager answered: where this client looked, and the likely cause."""
        looked = (
            f"looked for run {self.run_id}'s secret in {self.configured_dir} (run_root "
            f"{self.cfg.run_root!r} from the working directory {Path.cwd()}) and for a "
            f"live stager's record in {run_record(self.run_id)}"
        )
        if not read_consumer_secret(self.run_dir):
            hint = (
                "no stager of that run id is running on this host: start it first "
                "(`ringfeed run CONFIG --run-id ID --consumer none` does)"
            )
        else:  # the stager drops a hello whose secret is not its run's
            hint = f"{self.run_dir} holds a secret no live stager accepts (a stale one?)"
        return (
            f"no stager answered on {endpoints(self.cfg, self.run_id).control} within "
            f"{timeout_s:.0f} s: {looked}; {hint}"
        )

    def no_run(self) -> str:
        """No live stager recorded this run id and no process is starting one."""
        runs = ", ".join(live_runs()) or "none"
        return (
            f"no run {self.run_id!r} is known on this host: no live stager recorded it in "
            f"{run_record(self.run_id).parent} and no process is starting one; the live "
            f"runs here: {runs}. Check the run id, or start the run first (`ringfeed run "
            f"CONFIG --run-id {self.run_id} --consumer none`)"
        )

    def hello(self, rejoin: bool = False) -> p.ConsumerHello:
        """A hello at the client's position, with the run's secret as it is now (a
        restarted stager draws a new one): the one a live stager of the run recorded
        where that differs from the configured run directory's (none there: a client
        started in another working directory; another one there: a copy of an earlier
        run's folder, which the stager would refuse), else the configured one's. rejoin
        only when connecting: a client another one of its process took over from is
        refused when it says hello again, never takes the run back (the two would take
        it from each other forever)."""
        secret = read_consumer_secret(self.configured_dir)
        self.run_dir = self.configured_dir
        found = find_run_dir(self.run_id)
        live = read_consumer_secret(found) if found is not None else ""
        if live and live != secret:
            self.run_dir, secret = found, live
        return p.ConsumerHello(
            self.name, self.position, self.batch_index, secret, self.plan, self.new_plan_at, rejoin
        )

    def _attach(self, welcome: p.Welcome) -> None:
        """Joined: the stager's plan is ours from now on (a restarted stager with another
        plan refuses our rejoin)."""
        self._close_ring()
        self.ring = Ring.attach(welcome.ring_name)
        if self.pin is not None:
            address, nbytes = slots_span(self.ring)
            self.pin.pin(address, nbytes)
            self._pinned_at = address
        self.stager_pid = self.ring.owner_pid  # its batch ring's owner
        self.n_items = welcome.n_items  # plan positions per epoch
        self.plan, self.new_plan_at = dict(welcome.plan), 0

    def _wait(self, kinds: tuple[type, ...], timeout_s: float) -> p.Message | None:
        """The next message of `kinds` within timeout_s, or None. Meanwhile a connected
        client says it is alive every HELLO_RETRY_S, and rejoins a restarted stager: it
        answers REHELLO with a hello at the batch after the last one it returned. After
        a turn of PAUSED_S (the process stopped meanwhile) it reads what came first,
        for two polls at least: the batches sent meanwhile are in its socket."""
        deadline = last_heard = last_turn = time.monotonic()
        deadline += timeout_s
        paused = False
        while True:
            now = time.monotonic()
            was_paused, paused = paused, now - last_turn > PAUSED_S
            if paused and not was_paused:  # once for a run of slow turns: all slow ends it
                deadline = max(deadline, now + 2 * POLL_S)
            last_turn = now
            left = deadline - now
            if left <= 0 or not self.sock.poll(min(left, POLL_S) * 1000):
                if left <= 0:
                    return None
                if self.ring is not None and time.monotonic() - last_heard > HELLO_RETRY_S:
                    send(self.sock, p.Heartbeat(0, {}))  # a new stager answers REHELLO
                    last_heard = time.monotonic()
                continue
            last_heard = time.monotonic()
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
            if isinstance(msg, p.Refused):
                raise StagerRefused(f"the stager refused this consumer: {msg.reason}")
            if isinstance(msg, kinds):
                return msg
            if isinstance(msg, p.Rehello) and self.ring is not None:
                log.warning(
                    "the stager restarted; rejoining at plan position %d (batch %d)",
                    self.position,
                    self.batch_index,
                )
                send(self.sock, self.hello())
            elif isinstance(msg, p.Welcome) and self.ring is not None:
                self._attach(msg)  # the restarted stager's rings

    def stager_alive(self) -> bool:
        """Does the stager that welcomed this client still run?"""
        return bool(self.stager_pid) and pid_alive(self.stager_pid)

    def stager_verdict(self, waited_s: float) -> str:
        """Why no batch came for waited_s: the stager is gone, or it is alive and its
        producers are not delivering (a consumer asks before giving up)."""
        pid = self.stager_pid
        if not pid:
            return f"no WELCOME from the stager in {waited_s:.0f} s"
        if not pid_alive(pid):
            return f"the stager (pid {pid}) is gone: its log says why"
        return (
            f"the stager (pid {pid}) is alive but sent no batch for {waited_s:.0f} s: its "
            "producers are gone, stuck or too slow (`ringfeed inspect`, the producer pool's "
            "log); train.data_timeout_s sets this wait"
        )

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
        # Where a restarted stager must resume so that no batch comes twice or never.
        self.position, self.batch_index = msg.next_position, msg.batch_index + 1
        slot = {name: self.ring.view(name)[msg.slot] for name in self.ring.fields}
        arrays = batch_views(slot, msg.rows, msg.frames, msg.text_len, self.cfg.schema)
        return Batch(msg, arrays)

    def free(self, batch: Batch) -> None:
        """The caller has copied the batch: the stager may refill its slot."""
        batch.arrays = {}
        send(self.sock, p.BatchFree(batch.meta.slot, batch.meta.generation))

    def step_stats(
        self, step: int, step_s: float, wait_s: float, loss: float, rows: int = 0, frames: int = 0
    ) -> None:
        send(self.sock, p.StepStats(step, step_s, wait_s, loss, rows, frames))

    def close(self, finished: bool = True) -> None:
        """finished: tell the stager the run is over (it then stops the producers).
        Idempotent: a second call does nothing."""
        if self.sock.closed:
            return
        if finished:
            self._bye()
        self.sock.close()
        self._close_ring()
        self.ctx.term()

    def _bye(self) -> None:
        """BYE, until its BYE_ACK (SHUTDOWN_WAIT_S at most), said again every BYE_AGAIN_S
        meanwhile: a lost BYE had left the stager waiting stager.consumer_wait_s for a
        consumer that had gone (the stager answers each BYE). A stager restarted since it
        sent the end of the data drops a BYE from a consumer it never welcomed, and asks
        for a hello (REHELLO): once it has welcomed this one again, BYE goes again, with
        a new wait for this stager's answer."""
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        send(self.sock, p.Bye(0, {}))
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self._wait((p.ByeAck, p.Welcome), min(left, BYE_AGAIN_S))
            except StagerGone:
                return  # it is stopping anyway, which is what BYE asks for
            if isinstance(msg, p.ByeAck):
                return
            if isinstance(msg, p.Welcome):
                deadline = time.monotonic() + SHUTDOWN_WAIT_S
            send(self.sock, p.Bye(0, {}))

    def _close_ring(self) -> None:
        """Unpin (if pinned) and unmap the ring; the caller's copies out of it have ended."""
        if self.ring is None:
            return
        if self.pin is not None and self._pinned_at:
            self.pin.unpin(self._pinned_at)
            self._pinned_at = 0
        self.ring.close()


# What BatchWait.next returns while no batch came within its poll.
NO_BATCH = object()


class BatchWait:
    """The wait for the next batch in a feeding thread's loop, which polls so that it can
    stop: `next` returns the batch (None at the end of the data), or NO_BATCH after
    POLL_S without one; every WAITING_NOTE_S without one it warns with the stager's
    verdict, and past `limit_s` (train.data_timeout_s) it raises TimeoutError with it."""

    def __init__(self, client: BatchClient, limit_s: float) -> None:
        self.client, self.limit_s = client, limit_s
        self.last_note = time.monotonic()
        # Only time spent waiting counts against limit_s: a gap of PAUSED_S between two
        # readings (the thread busy with its queue between two calls, or the process
        # stopped) is left out.
        self.waiting = RunClock(PAUSED_S, who="")
        self.last_batch = self.waiting()
        self.last_batch_at = time.monotonic()  # the same, on the plain clock

    def next(self) -> Batch | None | object:
        self.waiting()  # the time since the last call, if that long, is left out
        try:
            batch = self.client.next(timeout_s=POLL_S)
        except TimeoutError:
            waited = self.waiting() - self.last_batch
            plain = time.monotonic() - self.last_batch_at
            # A stager that is gone is reported on the plain clock: no pause explains it.
            if (
                waited > self.limit_s
                or plain > PAUSED_LIMIT_FACTOR * self.limit_s
                or (plain > self.limit_s and not self.client.stager_alive())
            ):
                raise TimeoutError(self.client.stager_verdict(max(waited, plain))) from None
            if time.monotonic() - self.last_note > WAITING_NOTE_S:
                self.last_note = time.monotonic()
                log.warning(
                    "no batch for %.0f s (ending at train.data_timeout_s=%.0f): %s",
                    waited,
                    self.limit_s,
                    self.client.stager_verdict(waited),
                )
            return NO_BATCH
        self.last_note = self.last_batch_at = time.monotonic()
        self.last_batch = self.waiting()
        return batch
