"""What the PyTorch and JAX loaders share, without either framework: which run and
training worker they consume, their epochs and cursor, their stream, and the step
numbers they send the stager.

    RingLoaderBase(cfg, run_id, share)        a subclass gives place() and hand_out(),
                                              and host_pin (the batch ring pinned in
                                              place for its device: host_pin.py)
        __iter__                              a pass: the batches of one epoch
        __next__                              the next batch, placed; StopIteration at
                                              the epoch's end, and at the plan's end,
                                              max_steps or epochs (BYE: the run ends)
        __len__                               this worker's batches in the pass's epoch
        set_epoch(e) / load_cursor(state)     where the next pass starts (at the next
                                              iter(): a reload is no reconnection)
        cursor                                after the last batch the step used
        close(finished)                       BYE if finished, else the run waits

Epochs, as a DataLoader's users expect them (`for epoch in range(E): for batch in
loader:`): a pass ends after the last batch of its epoch, a batch belonging to the
epoch of its first row. The first batch of the next epoch, fetched to see the end, is
kept for the next pass. iter() starts a pass at the cursor, so a pass after a resume
mid-epoch holds that epoch's remaining batches, and `len(loader)` stays the epoch's
whole count (Lightning adds the batches it already trained: epoch_batches.py).

The cursor follows the batches used, not those fetched (ring_batch.py): a client that
reads ahead (Lightning's fetcher) saves the cursor after the batch its step trained.
A loader that closed its stream opens a new one at its cursor: the batches fetched
and never used come again.

Which run: cfg and run_id; in a model process started by the launcher (`ringfeed run
CONFIG -- COMMAND`), RINGFEED_CONFIG and RINGFEED_RUN_ID
(shared/config/environment.py); with neither, the loader starts the run's data side
itself (scripts/data_side.py, which ringfeed.torch and ringfeed.jax give it). With
several training workers, worker K of N consumes run `R-wK`, its share of the global
plan (shared/run/share.py, docs/scaling-out.md#the-model-on-several-gpus-and-several-hosts).
"""

from __future__ import annotations

import logging
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from ringfeed.consumer.client.batch_client import StagerGone, StagerRefused
from ringfeed.consumer.client.batch_stream import BatchStream, CopyEnd
from ringfeed.consumer.client.cursor import Cursor, PlanMismatch
from ringfeed.consumer.client.host_pin import HostPin
from ringfeed.consumer.client.progress import PROGRESS_EVERY, Progress
from ringfeed.consumer.client.signal_stop import SignalStop
from ringfeed.shared.config import Config, ConfigError, load_config
from ringfeed.shared.config.environment import model_process_run
from ringfeed.shared.run.share import Share
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

T = TypeVar("T")
# Batches placed on the device ahead of the one the step holds (the "two").
PREFETCH = 2


def resolve_run(cfg: Config | str | Path | dict | None, run_id: str | None) -> tuple[Config, str]:
    """(config, run id) from the arguments or, for a model process the launcher
    started, from its environment; run id "" when neither names a run (the loader then
    starts one: scripts/data_side.py); ValueError saying what to pass when there is no config."""
    if cfg is None or run_id is None:
        found = model_process_run()
        if found is not None:
            cfg = found[0] if cfg is None else cfg
            run_id = found[1] if run_id is None else run_id
    if cfg is None:
        raise ValueError(
            "a ringfeed loader needs the run's config: pass cfg= (a file, a dict or a "
            "Config: the loader then starts the run's stager and producers itself), or "
            "start your training command as the run's model process (`ringfeed run "
            "CONFIG -- python train.py`, which sets RINGFEED_CONFIG and RINGFEED_RUN_ID)"
        )
    if isinstance(cfg, dict):
        from ringfeed.shared.config import config_from_dict

        cfg = config_from_dict(cfg)
    elif not isinstance(cfg, Config):
        cfg = load_config(cfg)
    return cfg, run_id or ""


def global_batch(cfg: Config, rows: int) -> Config:
    """cfg with stager.batch_size `rows` (the global batch every rank's rows make)."""
    if rows == cfg.stager.batch_size:
        return cfg
    from ringfeed.shared.config import replace

    return replace(cfg, stager={"batch_size": rows})


def per_rank_batch(cfg: Config, batch_size: int | None, share: Share, run_id: str) -> Config:
    """cfg with the global batch that gives each of share.count ranks `batch_size`
    rows (None: cfg as it is); ValueError when it is not a positive integer, or when
    the run is one already started (run_id) whose global batch is another."""
    if batch_size is None:
        return cfg
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: this rank's rows, an integer >= 1")
    rows = batch_size * share.count
    if run_id and rows != cfg.stager.batch_size:
        raise ValueError(
            f"batch_size={batch_size} on each of {share.count} rank(s) is a global batch of "
            f"{rows}, but run {run_id!r} was started with stager.batch_size "
            f"{cfg.stager.batch_size} ({share.rows(cfg.stager.batch_size)} per rank): pass "
            f"batch_size={share.rows(cfg.stager.batch_size)}, or set stager.batch_size: "
            f"{rows} in the run's config"
        )
    return global_batch(cfg, rows)


class RingLoaderBase(Generic[T]):
    """The run's one consumer; subclasses place batches on their framework's device."""

    name = "loader"
    # What starts the run's data side when the loader is given no run: a class of
    # DataSide's face (scripts/data_side.py; ringfeed.torch and ringfeed.jax give it).
    # None: a run must be named, as in the example trainers.
    data_side_type: Any = None

    def __init__(
        self,
        cfg: Config,
        run_id: str,
        share: Share,
        prefetch: int = PREFETCH,
        stop: Callable[[], bool] | None = None,
        *,
        max_steps: int = 0,
        epochs: int = 0,
        progress_every: int = PROGRESS_EVERY,
    ) -> None:
        """run_id: "" starts the run's data side here (data_side_type); stop: the caller's
        stop flag: when it is set, iteration ends without BYE, so the run is left to the
        launcher's stop (the example trainers); without one, Ctrl-C, SIGTERM and SIGHUP
        end the iteration at the next batch (signal_stop.py);
        max_steps: end after this many batches of the plan (0: no limit); epochs: end
        after this many epochs (0: the plan's stager.epochs); progress_every: a
        progress line every this many steps (0: none)."""
        if prefetch < 1:
            raise ValueError(f"prefetch={prefetch}: at least one batch is placed ahead")
        for key, value in (("max_steps", max_steps), ("epochs", epochs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key}={value!r}: an integer >= 0 (0: no limit)")
        self.cfg, self.share, self.prefetch, self.stop = cfg, share, prefetch, stop
        self.signals = SignalStop() if stop is None else None
        self.max_steps, self.epochs = max_steps, epochs
        self.data_side: Any = None  # the stager and producers this loader started
        # The ring pinned in place for the subclass's device (host_pin.py), or None.
        self.host_pin: HostPin | None = None
        if not run_id and self.data_side_type is None:
            raise ValueError(
                "no run named: pass run_id=, start the command under `ringfeed run CONFIG "
                "-- COMMAND`, or use ringfeed.torch's or ringfeed.jax's RingLoader, which "
                "start the run's data side themselves"
            )
        owns = not run_id
        self.run_id = share.run_id(run_id or self.data_side_type.new_run_id())  # R-wK of N
        self.cursor = Cursor.fresh(cfg)  # after the last batch the step used
        self._fetched = self.cursor  # after the last batch handed out
        self._pending: Cursor | None = None  # where the next iter() starts, if moved
        self._new_plan_at = 0
        self._held: tuple[Any, p.BatchReady] | None = None  # the next epoch's first
        self._pass_epoch: int | None = None  # the epoch of the pass under way
        self.batches_this_pass = 0
        self._handed = self._used = 0  # serials of the batches handed out and used
        self._plan: Any = None  # the plan as the stager makes it (len; set_epoch)
        self.n_items = 0  # plan positions per epoch, once known
        self.stream: BatchStream | None = None
        self.steps = 0
        self.last_wait_s = 0.0
        self._loss: Any = 0.0
        self.last_loss = 0.0  # the last loss reported, as a float
        self._handed_at: float | None = None
        self._last: tuple[float, int, int] = (0.0, 0, 0)  # wait s, rows, frames
        self.last_meta: p.BatchReady | None = None  # the BATCH_READY of the last batch
        self.finished = False  # the plan's end (or max_steps, epochs) was reached
        self.progress = Progress(progress_every)
        if owns:
            self._start_data_side()

    # ------------------------------------------------------------ subclasses
    def place(self, arrays: dict[str, np.ndarray]) -> tuple[Any, CopyEnd | None]:
        """In the stream's thread: the copy to the device issued; (placed, the end of a
        copy that still reads the slot, or None: batch_stream.py's Place)."""
        raise NotImplementedError

    def hand_out(self, placed: Any, used: Callable[[], None]) -> T:
        """In the caller's thread: the batch the step may use now; it calls used() when
        the step first reads it (or the subclass calls it at once)."""
        raise NotImplementedError

    @property
    def ring_pinned(self) -> bool:
        """Do batches go to the device straight from the pinned ring now (else through a
        host copy out of the slot)?"""
        return self.host_pin is not None and self.host_pin.pinned

    def loss_value(self, loss: Any) -> float:
        """A loss the caller noted, as a float (a subclass may have waited for it)."""
        return float(loss)

    # ------------------------------------------------------------ epochs
    @property
    def epoch(self) -> int:
        """The epoch of the pass under way, else of the next one."""
        if self._pass_epoch is not None:
            return self._pass_epoch
        if self._held is not None:
            return self._held[1].first_epoch
        at = self._pending or self._fetched
        if not self.n_items:
            try:
                self.plan()
            except ConfigError:  # no prepared corpus here: the cursor's own word
                return at.epoch
        return at.position // self.n_items

    def __len__(self) -> int:
        """This worker's batches in the epoch of the pass under way (else the next):
        the DataLoader's len, the whole epoch's even when a resume starts inside it."""
        from ringfeed.consumer.client.epoch_batches import batches_in_epoch

        plan = self.plan()
        return batches_in_epoch(plan, self.cfg.stager.batch_size, self.epoch)

    def plan(self) -> Any:
        """The plan this worker's stager holds (made here once: epoch_batches.py)."""
        if self._plan is None:
            from ringfeed.consumer.client.epoch_batches import worker_plan

            self._plan = worker_plan(self.cfg, self.share)
            self.n_items = self._plan.n_items
        return self._plan

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch `epoch`: a cursor inside it stays (a resume goes on
        where it was), any other moves to the epoch's start, at the next batch."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"set_epoch({epoch!r}): an epoch is an integer >= 0")
        n = self.n_items or self.plan().n_items
        at = self._pending or self._fetched  # where the next batch begins
        if at.position // n != epoch:
            self._pending = Cursor(epoch * n, at.batch_index, epoch, at.seed, dict(at.plan))

    # ------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[T]:
        self._pass_epoch = None
        return self

    def __next__(self) -> T:
        if self.finished:  # the plan ended (its run with it): an iterator stays exhausted
            raise StopIteration
        if self.signals is not None and not self.signals():
            self.signals.install()
        t0 = time.perf_counter()
        self._report(t0)
        if self._stopped():  # a stop signal: no more batches, the run is not over
            self._end(finished=False)
        if self.max_steps and self._fetched.batch_index >= self.max_steps:
            self._end(finished=True)
        got = self._next_placed()
        if got is None:  # the plan ended: BYE, the stager ends the run; or stopped
            self._check_data_side()
            self._end(finished=not self._stopped())
        placed, meta = got
        if self.epochs and meta.first_epoch >= self.epochs:
            self._held = got
            self._end(finished=True)
        if self._pass_epoch is None:
            self._pass_epoch, self.batches_this_pass = meta.first_epoch, 0
        elif meta.first_epoch != self._pass_epoch:  # the next epoch's: for the next pass
            self._held, self._pass_epoch = got, None
            self._used_all()
            raise StopIteration
        self._handed += 1
        self.batches_this_pass += 1
        after = self._fetched.after(meta, self.stream.plan)
        self._fetched = after
        batch = self.hand_out(placed, self._user(self._handed, after))
        self.last_wait_s = time.perf_counter() - t0
        self._last = (self.last_wait_s, meta.n_valid, _frames(placed))
        self._handed_at = time.perf_counter()
        self.last_meta = meta
        self.progress.step(self._handed_at, self.last_wait_s, meta, self)
        return batch

    def _user(self, serial: int, after: Cursor) -> Callable[[], None]:
        """What the batch `serial` calls when the step first reads it: the cursor moves
        to after it (never back to an earlier one)."""

        def used() -> None:
            if serial > self._used:
                self._used, self.cursor = serial, after

        return used

    def _used_all(self) -> None:
        """Every batch handed out counts as used (a pass that ran to its end)."""
        self._used, self.cursor = self._handed, self._fetched

    def _next_placed(self) -> tuple[Any, p.BatchReady] | None:
        if self._pending is not None:
            self._restart()
        if self._held is not None:
            got, self._held = self._held, None
            return got
        return self._open().get()

    def _end(self, finished: bool) -> None:
        """The end of the plan (finished: BYE, the run ends) or a stop: StopIteration."""
        self._used_all()
        self.finished, self._pass_epoch = finished, None
        self.close(finished=finished)
        raise StopIteration

    def _stopped(self) -> bool:
        """Has the caller's stop flag, or a stop signal, said stop?"""
        if self.signals is not None:
            return self.signals()
        return self.stop is not None and self.stop()

    @property
    def stopped(self) -> str:
        """The stop signal that ended the iteration ("SIGINT", "SIGTERM", "SIGHUP"), or
        "": after one, every pass ends at once and the loop's checkpoint code runs."""
        return self.signals.name if self.signals is not None else ""

    def _stream_stop(self) -> bool:
        """What ends the stream's waits: a stop, or the death of our data side."""
        return self._stopped() or bool(self.data_side is not None and self.data_side.died())

    # ------------------------------------------------------------ the data side
    def _start_data_side(self) -> None:
        """The run's stager and producers as children of this process, ended with the
        loader: at close(), when it is collected, and at the interpreter's exit."""
        if self.data_side is None:
            self.data_side = self.data_side_type(self.cfg, self.run_id, self.share)
            weakref.finalize(self, self.data_side.stop)
        self.data_side.start()

    def _check_data_side(self) -> None:
        """StagerGone with the stager's log when the stager this loader started died."""
        died = self.data_side.died() if self.data_side is not None else ""
        if died:
            raise StagerGone(died)

    def note_loss(self, loss: Any) -> None:
        """The last step's loss, for the inspector's trainer line and the progress line
        (optional); read only when the next step's numbers go out."""
        self._loss = loss

    def _report(self, now: float) -> None:
        """The step that ended now (the caller asks for the next batch): its numbers
        to the stager, as the TensorFlow trainer sends them."""
        if self._handed_at is None or self.stream is None:
            return
        wait_s, rows, frames = self._last
        self.steps += 1
        loss = self.last_loss = self.loss_value(self._loss)
        self.stream.send_stats(self.steps, now - self._handed_at, wait_s, loss, rows, frames)
        self._handed_at = None

    # ------------------------------------------------------------ the stream
    def _open(self) -> BatchStream:
        """The open stream, or a new one at the cursor (connected: refusals raise here)."""
        if self.stream is not None:
            return self.stream
        if self.data_side is not None and not self.data_side.running:
            self._start_data_side()  # closed and iterated again: at the cursor
        self._fetched = self.cursor
        self._handed = self._used
        # The stream's thread reaches this loader only weakly: a live thread is never
        # collected, and what it holds would keep a loader dropped without close() (and
        # the stager and producers it started) alive until the interpreter's exit.
        me = weakref.ref(self)

        def place(arrays: dict[str, np.ndarray]) -> tuple[Any, CopyEnd | None]:
            loader = me()
            if loader is None:
                raise StagerGone("the loader was collected")
            try:
                return loader._place(arrays)
            except BaseException as exc:  # handed to the caller: its frames held the loader
                traceback.clear_frames(exc.__traceback__)
                raise
            finally:
                del loader

        def stop() -> bool:
            loader = me()
            return loader is None or loader._stream_stop()

        stream = BatchStream(
            self.cfg,
            self.run_id,
            self.cursor,
            place,
            self.prefetch,
            self.name,
            stop,
            self._new_plan_at,
            self.host_pin,
        )
        try:
            stream.connect()
        except StagerRefused as exc:
            if self.cursor.plan and "plan changed" in str(exc):
                raise PlanMismatch(str(exc)) from None
            raise
        except StagerGone:
            self._check_data_side()
            raise
        if not self._new_plan_at:
            self.cursor.check_plan(stream.plan)  # a stager that took it must have its plan
        self._new_plan_at = 0
        self.n_items = stream.client.n_items
        stream.start()
        self.stream = stream
        return stream

    def _place(self, arrays: dict[str, np.ndarray]) -> tuple[Any, CopyEnd | None]:
        """place(), with each row's epoch beside its plan position (-1: padding)."""
        position = arrays["position"]
        n = max(self.n_items, 1)
        arrays = dict(arrays, epoch=np.where(position >= 0, position // n, -1))
        return self.place(arrays)

    def _restart(self) -> None:
        """A cursor loaded or an epoch set: the next stream starts there."""
        pending, self._pending = self._pending, None
        if pending == self._fetched and self.stream is not None and self._used == self._handed:
            return  # the open stream goes on from there anyway: no reconnection
        self._close_stream(finished=False)
        self.cursor = self._fetched = pending

    def load_cursor(self, state: Any, new_plan: bool = False) -> None:
        """Resume at a saved cursor, from the next iter(): its seed is checked here, its
        plan here too once the stager's is known (else when the stream connects),
        PlanMismatch naming what differs. new_plan: if the plan changed, start a new
        one at the epoch after the cursor's instead (the trainers' --new-plan)."""
        cursor = Cursor.from_dict(state, self.cfg)
        if self.stream is not None and not new_plan:
            cursor.check_plan(self.stream.plan)
        self._new_plan_at = cursor.epoch + 1 if new_plan else 0
        self._handed_at = None
        if self.stream is None:
            self.cursor = self._fetched = cursor
            self._held = None
            return
        self._pending = cursor
        if new_plan:
            self._restart()

    def close(self, finished: bool = False) -> None:
        """End the stream. finished=True says BYE: the stager ends the run and stops its
        producers; False (the default) leaves the run to a later consumer. A data side
        this loader started ends here either way (iterating again starts it anew, at the
        cursor)."""
        self._close_stream(finished)
        if self.signals is not None:
            self.signals.restore()
        if self.data_side is not None:
            self.data_side.stop(finished)

    def _close_stream(self, finished: bool) -> None:
        if self.stream is not None:
            self._report(time.perf_counter())
            self.stream.close(finished)
            self.stream = None
        self._held = None

    def __enter__(self) -> RingLoaderBase[T]:
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        self.close(finished=exc_type is None and not self.stopped)

    # ------------------------------------------------------------ pickling
    # What a copy does not take: the stream and its thread, the placed batches, the plan.
    UNPICKLED = ("stream", "_held", "_plan", "progress", "data_side", "host_pin")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in self.UNPICKLED:
            state.pop(key, None)
        state["_fetched"] = state["cursor"] = self._pending or self.cursor
        state["_pending"], state["_handed"], state["_used"] = None, 0, 0
        state["_progress_every"] = self.progress.every
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        every = state.pop("_progress_every")
        self.__dict__.update(state)
        self.stream, self._held, self._plan, self.data_side = None, None, None, None
        self.host_pin = None
        self.progress = Progress(every)


def _frames(placed: Any) -> int:
    return int(getattr(placed, "frames", 0))
