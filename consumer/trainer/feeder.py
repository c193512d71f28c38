"""The trainer's feeder thread: owns the BatchClient, copies batch k+1 while step k runs.

Used by the trainer process (consumer/trainer/trainer.py). BatchClient is not
thread-safe, so every socket call of the trainer happens in this one thread:

    connect -> loop: next() -> copy views to tensors on the device -> free()
                     -> put on `batches` (maxsize 2); send queued step stats
            -> close(finished) when the trainer says so

The copy must be a real one: free() hands the slot back and the stager
overwrites it while the step that uses the tensors may not have run yet.
Every blocking call has a timeout of POLL_S-scale and checks the stop flag,
so SIGTERM ends the thread within a few polls.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ringfeed.consumer.client.batch_client import NO_BATCH, Batch, BatchClient, BatchWait
from ringfeed.shared.config import Config
from ringfeed.shared.run.process import POLL_S, StopFlag
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

# Batches copied ahead of the step: 2 = one on the device while another is copied.
PREFETCH = 2


@dataclass
class FedBatch:
    """One batch copied to the trainer's device, with `meta`, the stager's BATCH_READY.

    tensors: name -> tf.Tensor as cfg.batch_fields() ([B, ...], on the device);
    items: int64 [n_valid] plan item ids of the real (non-padding) rows.
    """

    meta: p.BatchReady
    tensors: dict[str, Any]
    items: np.ndarray
    # (true mel frames, padded mel frames, true tokens, padded tokens) of its rows.
    fill: tuple[int, int, int, int] = (0, 0, 0, 0)
    # The real rows' speaker and language ids, for TensorBoard (None: not in the batch).
    speakers: np.ndarray | None = None
    languages: np.ndarray | None = None


class EndOfData:
    """Put on the queue when a finite plan has no more batches."""


class Feeder(threading.Thread):
    """Background thread between the BatchClient and the trainer's main loop."""

    def __init__(
        self,
        cfg: Config,
        run_id: str,
        position: int,
        batch_index: int,
        device: str,
        stop: StopFlag,
        plan: dict[str, str] | None = None,
        new_plan_at: int = 0,
    ) -> None:
        """plan, new_plan_at: as BatchClient's (the checkpoint's plan fingerprint)."""
        super().__init__(name="feeder", daemon=True)
        self._client_args = (cfg, run_id, "trainer", position, batch_index, plan, new_plan_at)
        self.client: BatchClient | None = None
        self.device, self.stop = device, stop
        self.batches: queue.Queue[FedBatch | EndOfData | BaseException] = queue.Queue(PREFETCH)
        self._stats: queue.Queue[tuple[int, float, float, float, int, int]] = queue.Queue()
        self._done = threading.Event()
        self._finished = False
        self.error: Exception | None = None

    # ------------------------------------------------------------ main thread API
    @property
    def plan(self) -> dict[str, str]:
        """The stager's plan fingerprint once joined (for the checkpoints' cursor)."""
        client = self.client
        return dict(client.plan) if client is not None else {}

    def get(self) -> FedBatch | EndOfData | None:
        """Next batch for the trainer; None when stopped. Re-raises the feeder's error."""
        while not self.stop.is_set():
            try:
                item = self.batches.get(timeout=POLL_S)
            except queue.Empty:
                if not self.is_alive() and self.batches.empty():
                    raise self.error or RuntimeError("the feeder ended without a batch") from None
                continue
            if isinstance(item, BaseException):
                raise item
            return item
        return None

    def send_stats(
        self, step: int, step_s: float, wait_s: float, loss: float, rows: int, frames: int
    ) -> None:
        """Queue one step's numbers for the stager (it shows them in the inspector)."""
        self._stats.put((step, step_s, wait_s, loss, rows, frames))

    def finish(self, finished: bool, timeout_s: float) -> None:
        """End the thread; finished=True sends BYE so the stager ends the run."""
        self._finished = finished
        self._done.set()
        self.join(timeout_s)
        if self.is_alive():
            log.warning("feeder did not stop within %.1f s", timeout_s)

    # ------------------------------------------------------------ feeder thread
    def run(self) -> None:
        # Made here, not in __init__: the socket lives and dies in this thread.
        self.client = BatchClient(*self._client_args)
        try:
            self._connect()
            self._loop()
            # Wait for the trainer's verdict so the last step's stats and BYE go out.
            while not (self.stop.is_set() or self._done.wait(POLL_S)):
                self._flush_stats()
        except Exception as exc:  # whatever ends this thread must reach the trainer
            self.error = exc
            self._put(exc)
        finally:
            self._flush_stats()
            self.client.close(finished=self._finished)

    def _connect(self) -> None:
        timeout_s = self._client_args[0].train.connect_timeout_s
        self.client.connect(timeout_s, lambda: self.stop.is_set() or self._done.is_set())

    def _loop(self) -> None:
        wait = BatchWait(self.client, self._client_args[0].train.data_timeout_s)
        while not (self.stop.is_set() or self._done.is_set()):
            self._flush_stats()
            batch = wait.next()
            if batch is NO_BATCH:
                continue
            if batch is None:
                self._put(EndOfData())
                return
            fed = self._copy(batch)
            self.client.free(batch)
            self._put(fed)

    def _copy(self, batch: Batch) -> FedBatch:
        import tensorflow as tf

        # np.array(copy=True) first: on the CPU tf.constant may alias an aligned numpy
        # buffer, and on a GPU the host-to-device copy can be asynchronous; either way
        # the tensor would still read the slot after free() lets the stager refill it.
        with tf.device(self.device):
            tensors = {
                name: tf.constant(np.array(view, copy=True)) for name, view in batch.arrays.items()
            }
        items = np.array(batch.arrays["items"][: batch.meta.n_valid], copy=True)
        a = batch.arrays
        fill = (
            int(a["mel_lens"].sum()),
            a["mel"].shape[0] * a["mel"].shape[1],
            int(a["text_lens"].sum()),
            a["tokens"].size,
        )
        n = batch.meta.n_valid
        ids = [np.array(a[k][:n], copy=True) if k in a else None for k in ("speaker", "language")]
        return FedBatch(batch.meta, tensors, items, fill, *ids)

    def _put(self, item: FedBatch | EndOfData | BaseException) -> None:
        while not (self.stop.is_set() or self._done.is_set()):
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
