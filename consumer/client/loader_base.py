"""What the PyTorch and JAX loaders share, without either framework: which run and
training worker they consume, their cursor, their stream, and the step numbers they
send the stager.

    RingLoaderBase(cfg, run_id, share)        a subclass gives place() and hand_out()
        __iter__ / __next__                   the next batch, placed; StopIteration at
                                              the plan's end (BYE: the run ends)
        cursor / load_cursor(state)           where it stands; resume there (checked)
        close(finished)                       BYE if finished, else the run waits

A loader is its own iterator: iterating it again after a `break` goes on with the
next batch (the prefetched ones are kept), and a loader whose stream was closed opens
a new one at its cursor. The cursor moves when a batch is handed out, never when it
is prefetched, so a checkpoint taken after step k resumes at batch k + 1.

Which run: cfg and run_id, or, in a model process started by the launcher
(`ringfeed run CONFIG -- COMMAND`), RINGFEED_CONFIG and RINGFEED_RUN_ID
(shared/config/environment.py). With several training workers, worker K of N
consumes run `R-wK`, its share of the global plan (shared/run/share.py,
docs/scaling-out.md#the-model-on-several-gpus-and-several-hosts).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from ringfeed.consumer.client.batch_client import StagerRefused
from ringfeed.consumer.client.batch_stream import BatchStream
from ringfeed.consumer.client.cursor import Cursor, PlanMismatch
from ringfeed.shared.config import Config, load_config
from ringfeed.shared.config.environment import model_process_run
from ringfeed.shared.run.share import Share
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

T = TypeVar("T")
# Batches placed on the device ahead of the one the step holds (the "two").
PREFETCH = 2


def resolve_run(cfg: Config | str | Path | None, run_id: str | None) -> tuple[Config, str]:
    """(config, run id) from the arguments or, for a model process the launcher
    started, from its environment; ValueError saying what to pass otherwise."""
    if cfg is None or run_id is None:
        found = model_process_run()
        if found is None:
            raise ValueError(
                "a ringfeed loader needs the run's config and run id: pass cfg= and run_id=, "
                "or start your training command as the run's model process "
                "(`ringfeed run CONFIG -- python train.py`, which sets RINGFEED_CONFIG and "
                "RINGFEED_RUN_ID)"
            )
        cfg = found[0] if cfg is None else cfg
        run_id = found[1] if run_id is None else run_id
    if not isinstance(cfg, Config):
        cfg = load_config(cfg)
    return cfg, run_id


class RingLoaderBase(Generic[T]):
    """The run's one consumer; subclasses place batches on their framework's device."""

    name = "loader"

    def __init__(
        self,
        cfg: Config,
        run_id: str,
        share: Share,
        prefetch: int = PREFETCH,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """stop: the caller's stop flag (a signal): when it is set, iteration ends without
        BYE, so the run is left to the launcher's stop (the example trainers)."""
        if prefetch < 1:
            raise ValueError(f"prefetch={prefetch}: at least one batch is placed ahead")
        self.cfg, self.share, self.prefetch, self.stop = cfg, share, prefetch, stop
        self.run_id = share.run_id(run_id)  # worker K of N consumes run R-wK
        self.cursor = Cursor.fresh(cfg)
        self.stream: BatchStream | None = None
        self.steps = 0
        self.last_wait_s = 0.0
        self._loss = 0.0
        self._handed_at: float | None = None
        self._last: tuple[float, int, int] = (0.0, 0, 0)  # wait s, rows, frames
        self.last_meta: p.BatchReady | None = None  # the BATCH_READY of the last batch
        self._new_plan_at = 0
        self.finished = False  # the plan's end was reached

    # ------------------------------------------------------------ subclasses
    def place(self, arrays: dict[str, np.ndarray]) -> Any:
        """In the stream's thread: one host copy out of the slot, the device copy issued."""
        raise NotImplementedError

    def hand_out(self, placed: Any) -> T:
        """In the caller's thread: the batch the step may use now."""
        raise NotImplementedError

    # ------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self.finished:  # the plan ended (its run with it): an iterator stays exhausted
            raise StopIteration
        t0 = time.perf_counter()
        self._report(t0)
        stream = self._open()
        got = stream.get()
        if got is None:  # the plan ended: BYE, the stager ends the run; or stopped
            self.finished = not self.stop()
            self.close(finished=self.finished)
            raise StopIteration
        placed, meta = got
        batch = self.hand_out(placed)
        self.cursor = self.cursor.after(meta, stream.plan)
        self.last_wait_s = time.perf_counter() - t0
        self._last = (self.last_wait_s, meta.n_valid, _frames(placed))
        self._handed_at = time.perf_counter()
        self.last_meta = meta
        return batch

    def note_loss(self, loss: float) -> None:
        """The last step's loss, for the inspector's trainer line (optional)."""
        self._loss = float(loss)

    def _report(self, now: float) -> None:
        """The step that ended now (the caller asks for the next batch): its numbers
        to the stager, as the TensorFlow trainer sends them."""
        if self._handed_at is None or self.stream is None:
            return
        wait_s, rows, frames = self._last
        self.steps += 1
        self.stream.send_stats(self.steps, now - self._handed_at, wait_s, self._loss, rows, frames)
        self._handed_at = None

    # ------------------------------------------------------------ the stream
    def _open(self) -> BatchStream:
        """The open stream, or a new one at the cursor (connected: refusals raise here)."""
        if self.stream is not None:
            return self.stream
        stream = BatchStream(
            self.cfg,
            self.run_id,
            self.cursor,
            self.place,
            self.prefetch,
            self.name,
            self.stop,
            self._new_plan_at,
        )
        try:
            stream.connect()
        except StagerRefused as exc:
            if self.cursor.plan and "plan changed" in str(exc):
                raise PlanMismatch(str(exc)) from None
            raise
        if not self._new_plan_at:
            self.cursor.check_plan(stream.plan)  # a stager that took it must have its plan
        self._new_plan_at = 0
        stream.start()
        self.stream = stream
        return stream

    def load_cursor(self, state: Any, new_plan: bool = False) -> None:
        """Resume at a saved cursor: checked at once against the plan of the stager
        (connecting to it if needed), PlanMismatch naming what differs. new_plan: if the
        plan changed, start a new one at the epoch after the cursor's instead (the
        trainers' --new-plan)."""
        cursor = Cursor.from_dict(state, self.cfg)
        if self.stream is not None:
            if not new_plan:
                cursor.check_plan(self.stream.plan)
            self.close(finished=False)
        self.cursor = cursor
        self._new_plan_at = cursor.epoch + 1 if new_plan else 0
        self._handed_at = None
        self._open()

    def close(self, finished: bool = False) -> None:
        """End the stream. finished=True says BYE: the stager ends the run and stops its
        producers; False (the default) leaves the run to a later consumer."""
        if self.stream is not None:
            self._report(time.perf_counter())
            self.stream.close(finished)
            self.stream = None

    def __enter__(self) -> RingLoaderBase[T]:
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        self.close(finished=exc_type is None)


def _frames(placed: Any) -> int:
    return int(getattr(placed, "frames", 0))
