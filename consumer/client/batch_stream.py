"""A BatchClient in a thread of its own that places batches ahead of the step: the one
prefetch under every model process, the TensorFlow trainer (consumer/trainer/trainer.py)
and the PyTorch and JAX loaders (consumer/client/torch_loader.py, jax_loader.py). No
framework here: the caller hands it `place`.

    stream = BatchStream(cfg, run_id, cursor, place, depth=2)
    stream.connect()                 # caller's thread: WELCOME, or StagerRefused / StagerGone
    stream.start()
    while (got := stream.get()) is not None:     # (placed, meta); None at the plan's end
        ... the step on got[0] ...                #   (stream.ended) or when stopped
        stream.send_stats(step, step_s, wait_s, loss, rows, frames)
    stream.close(finished=True)      # BYE: the stager ends the run

The thread, which alone touches the client once started (BatchClient is not
thread-safe; the caller's thread hands it over before start(), a barrier):

    loop: next() -> place(arrays) -> free() once nothing reads the slot
                 -> queue (`depth` batches ahead)
          flush queued step stats; check done

`place(arrays)` issues the copy of a batch to the device and returns (placed, reading):
`reading` None when place made what it keeps out of the slot (a host copy, into
pinned memory or a fresh array), and the slot is freed at once; else the end of a
copy that still reads the slot (CopyEnd: a CUDA event, JAX's arrays ready), which the
slot waits for (SlotReads): the ring pinned in place (host_pin.py), where the copy to
the device is the only copy. Either way place keeps no view of the slot once it is
freed, since the stager overwrites it at once. The thread waits for a copy's end
before anything else it would wait for (the next batch, room in the queue), so a
slot goes back as soon as its copy has ended, never after a step.

With a queue of `depth` 2 and the batch the step holds, three batches are in
flight: triple buffering. Every blocking call has a POLL_S-scale timeout and checks
the done flag, so close() ends the thread within a few polls.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from ringfeed.consumer.client.batch_client import NO_BATCH, Batch, BatchClient, BatchWait, RingPin
from ringfeed.consumer.client.cursor import Cursor
from ringfeed.shared.config import Config
from ringfeed.shared.run.process import POLL_S, SHUTDOWN_WAIT_S
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

T = TypeVar("T")


class CopyEnd(Protocol):
    """The end of a copy to the device that still reads a batch slot: a
    torch.cuda.Event has this face; JAX's arrays ready (jax_loader.py) too."""

    def query(self) -> bool:
        """Has the copy ended? Never waits."""

    def synchronize(self) -> None:
        """Return once the copy has ended (the host waits for that copy only)."""


# place(arrays) -> (placed, the end of a copy still reading the slot, or None).
Place = Callable[[dict[str, np.ndarray]], tuple[T, CopyEnd | None]]


class SlotReads:
    """Batches whose slot a copy to the device still reads, each freed once its copy
    ended, in the order they came: BATCH_FREE waits for the copy, never for a step."""

    def __init__(self, free: Callable[[Batch], None]) -> None:
        self.free = free
        self.pending: collections.deque[tuple[Batch, CopyEnd]] = collections.deque()

    def add(self, batch: Batch, reading: CopyEnd | None) -> None:
        """A batch just placed: freed now when nothing reads its slot (None)."""
        if reading is None:
            self.free(batch)
        else:
            self.pending.append((batch, reading))

    def release(self, wait: bool = False) -> None:
        """Free each batch whose copy has ended; wait: wait for each copy first."""
        while self.pending:
            batch, reading = self.pending[0]
            if wait:
                reading.synchronize()
            elif not reading.query():
                return
            self.pending.popleft()
            self.free(batch)


class _End:
    """Put on the queue when a finite plan has no more batches."""


class BatchStream(threading.Thread, Generic[T]):
    """One consumer of a run, prefetching `depth` placed batches in its thread."""

    def __init__(
        self,
        cfg: Config,
        run_id: str,
        cursor: Cursor,
        place: Place,
        depth: int = 2,
        name: str = "loader",
        stop: Callable[[], bool] | None = None,
        new_plan_at: int = 0,
        pin: RingPin | None = None,
    ) -> None:
        """cursor: where to start, and the plan it must be (its plan {}: any); place:
        the copy to the device (the module's docstring); name: the consumer's, as the
        stager logs it; stop: the caller's stop flag (a signal), checked by every wait;
        new_plan_at: if the cursor's plan is not the stager's, start a new plan at this
        epoch (0: be refused); pin: pins each mapping of the ring for place's copies
        (BatchClient's)."""
        super().__init__(name=f"{name}-stream", daemon=True)
        # rejoin: a loader iterated again in this process takes the run over from its
        # last stream (dropped, maybe not yet closed): one consumer means one socket.
        self.client = BatchClient(
            cfg,
            run_id,
            name,
            cursor.position,
            cursor.batch_index,
            cursor.plan,
            new_plan_at,
            rejoin=True,
            pin=pin,
        )
        self.cfg, self.place, self.stop = cfg, place, stop
        self.reads = SlotReads(self.client.free)
        self.ended = False  # the plan's end was handed out (get() returned None for it)
        self.batches: queue.Queue[tuple[T, p.BatchReady] | _End | BaseException]
        self.batches = queue.Queue(depth)
        self._stats: queue.Queue[tuple[int, float, float, float, int, int]] = queue.Queue()
        self._done = threading.Event()
        self._finished = False

    @property
    def plan(self) -> dict[str, str]:
        """The stager's plan fingerprint (after connect)."""
        return dict(self.client.plan)

    # ------------------------------------------------------------ the caller's thread
    def connect(self) -> None:
        """Join the run (train.connect_timeout_s); raises StagerRefused (the plan
        changed, another consumer holds the run) or StagerGone. Before start()."""
        try:
            self.client.connect(self.cfg.train.connect_timeout_s, self._stopped)
        except BaseException:
            self.client.close(finished=False)
            raise

    def get(self) -> tuple[T, p.BatchReady] | None:
        """The next placed batch and its BATCH_READY; None at the end of the plan or
        when stopped; re-raises what ended the thread (a timeout, a lost stager)."""
        while not self._stopped():
            try:
                item = self.batches.get(timeout=POLL_S)
            except queue.Empty:
                if not self.is_alive() and self.batches.empty():
                    raise RuntimeError("the loader's stream ended without a batch") from None
                continue
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, _End):
                self.ended = True
                return None
            return item
        return None

    def send_stats(
        self, step: int, step_s: float, wait_s: float, loss: float, rows: int, frames: int
    ) -> None:
        """Queue one step's numbers for the stager (the inspector's trainer line)."""
        self._stats.put((step, step_s, wait_s, loss, rows, frames))

    def close(self, finished: bool) -> None:
        """End the thread and the client; finished=True says BYE (the stager ends the
        run and stops the producers), False leaves the run to a later consumer."""
        self._finished = finished
        self._done.set()
        if self.is_alive():
            self.join(SHUTDOWN_WAIT_S + 1.0)
            if self.is_alive():
                log.warning("the loader's stream did not stop within %.0f s", SHUTDOWN_WAIT_S)
        elif self.ident is None:  # never started: the client is still this thread's
            self.client.close(finished=finished)

    # ------------------------------------------------------------ the stream's thread
    def run(self) -> None:
        try:
            self._loop()
            # The plan ended: wait for the caller's verdict so its last stats and BYE go out.
            while not (self._stopped() or self._done.wait(POLL_S)):
                self._flush_stats()
        except Exception as exc:  # whatever ends this thread must reach the caller
            self._put(exc)
        finally:
            try:
                self.reads.release(wait=True)  # no copy reads the ring once it is unmapped
            finally:
                self._flush_stats()
                self.client.close(finished=self._finished)

    def _stopped(self) -> bool:
        return self._done.is_set() or (self.stop is not None and self.stop())

    def _loop(self) -> None:
        wait = BatchWait(self.client, self.cfg.train.data_timeout_s)
        while not self._stopped():
            self._flush_stats()
            self.reads.release(wait=True)  # the last copy out of a slot ends first
            batch = wait.next()
            if batch is NO_BATCH:
                continue
            if batch is None:
                self._put(_End())
                return
            reading = None
            try:
                placed, reading = self.place(batch.arrays)
            finally:
                self.reads.add(batch, reading)  # place failed: nothing reads the slot
            if self.batches.full():  # the step is behind: the slot need not wait for it
                self.reads.release(wait=True)
            self._put((placed, batch.meta))

    def _put(self, item: Any) -> None:
        while not self._stopped():
            self._flush_stats()
            try:
                self.batches.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue

    def _flush_stats(self) -> None:
        while True:
            try:
                stats = self._stats.get_nowait()
            except queue.Empty:
                return
            self.client.step_stats(*stats)
