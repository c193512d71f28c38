"""The example trainers' loop, for PyTorch and JAX alike (`ringfeed trainer CONFIG
--trainer torch|jax`: torch_example/, jax_example/). No framework here: each gives a
ModelSide, and this loop is the TensorFlow trainer's, on a loader:

    setup     the framework's side: device (chosen before its import), model,
              optimizer, loader; the latest checkpoint restored and the loader at its
              cursor (a cursor of another plan: exit 2, saying what changed)
    loop      next batch (time blocked = data wait) -> step (the loss on the host:
              true step time) -> metrics -> log every train.log_every -> checkpoint
              every train.checkpoint_every; until train.steps (counting restored
              steps), the end of a finite plan, a stop signal, or the stager gone
    teardown  checkpoint; BYE when finished (the stager ends the run), not when
              stopped by a signal (the launcher stops the others); summary.json

The loader sends each step's numbers to the stager, so the inspector shows this
trainer as it shows TensorFlow's. Exit codes as the TensorFlow trainer's: 0 finished
or stopped, 2 refused (another plan, another consumer), 1 a lost stager or any error.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ringfeed.consumer.client.batch_client import StagerGone, StagerRefused
from ringfeed.consumer.client.cursor import PlanMismatch
from ringfeed.consumer.client.loader_base import RingLoaderBase
from ringfeed.consumer.devices import gpu_stats
from ringfeed.consumer.trainer.checkpoint_files import FileCheckpoints
from ringfeed.consumer.trainer.metrics import StepMetrics, format_line
from ringfeed.consumer.trainer.trainer import (
    STAGER_SUMMARY_WAIT_S,
    STOP_GRACE_S,
    STOPPED_SUMMARY_WAIT_S,
    open_batch_log,
    read_stager_json,
    run_numbers,
)
from ringfeed.shared.config import Config
from ringfeed.shared.config.environment import run_dir
from ringfeed.shared.run.process import StopFlag, write_json_atomic
from ringfeed.shared.run.share import ONE_WORKER, Share

log = logging.getLogger(__name__)


class ModelSide(Protocol):
    """What a framework's example trainer gives the loop (torch_example, jax_example:
    each module's `Side: type[ModelSide]`, which mypy checks in .ci/run). Its data are
    read-only here: a property or a plain attribute of the Side fits."""

    @property
    def loader(self) -> RingLoaderBase: ...
    @property
    def device(self) -> str: ...  # where it trains, for the log ("cuda:0", "cpu", "2 x gpu")
    @property
    def mode(self) -> str: ...  # DevicePlan.mode
    @property
    def n_params(self) -> int: ...
    @property
    def trace_count(self) -> int: ...  # step programs traced and compiled so far
    @property
    def suffix(self) -> str: ...  # its checkpoint file's (".pt", ".npz")

    def step(self, batch: dict[str, Any]) -> float:
        """One optimizer step; the loss once on the host (so the step has ended)."""

    def save(self, path: Path) -> None:
        """Weights and optimizer state to path."""

    def load(self, path: Path) -> None:
        """Weights and optimizer state from path; raises when they do not fit."""

    def host(self, array: Any) -> np.ndarray:
        """One field of a batch on the host."""


@dataclass
class Loop:
    """What the loop updates."""

    cfg: Config
    side: ModelSide
    checkpoints: FileCheckpoints
    step: int = 0
    metrics: StepMetrics = field(default_factory=StepMetrics)
    losses: list[float] = field(default_factory=list)
    samples: int = 0
    first_step_s: float | None = None
    ended: str = ""
    batch_log: Any = None


def setup(cfg: Config, run_id: str, side: ModelSide, new_plan: bool) -> Loop:
    """The checkpoint restored into the model and the loader at its cursor; raises
    PlanMismatch (or StagerRefused) when the stager's plan is another."""
    directory = run_dir(cfg, run_id)
    checkpoints = FileCheckpoints(directory, side.suffix, side.save, side.load)
    restored = checkpoints.restore_latest()
    loop = Loop(cfg, side, checkpoints)
    if restored is not None:
        loop.step, cursor = restored
        side.loader.load_cursor(cursor, new_plan=new_plan)
    if cfg.train.log_batches:
        loop.batch_log = open_batch_log(directory / "batches.jsonl")
    log.info(
        "%s trainer on %s (%s): %d params, step %d of %d",
        type(side).__name__,
        side.device,
        side.mode,
        side.n_params,
        loop.step,
        cfg.train.steps,
    )
    return loop


def train(loop: Loop, stop: StopFlag) -> None:
    """Get, step, measure, log, checkpoint; sets loop.ended to why it stopped."""
    cfg, side, loader = loop.cfg, loop.side, loop.side.loader
    while loop.step < cfg.train.steps:
        t0 = time.perf_counter()
        batch = next(loader, None)
        if batch is None and not (loader.finished or stop.is_set()):
            batch = next(iter(loader), None)  # an epoch ended: the next one's pass
        if batch is None:
            loop.ended = "stopped" if stop.is_set() else "end of data"
            return
        wait_s, traces = loader.last_wait_s, side.trace_count
        loss = side.step(batch)
        step_s = time.perf_counter() - t0 - wait_s
        loader.note_loss(loss)
        loop.step += 1
        meta = loader.last_meta
        assert meta is not None  # set with every batch
        loop.samples += meta.n_valid
        loop.losses.append(loss)
        if side.trace_count != traces:  # a compiling step stays out of the timings
            loop.first_step_s = step_s if loop.first_step_s is None else loop.first_step_s
        else:
            frames = int(side.host(batch["mel_lens"]).sum())
            loop.metrics.record(step_s, wait_s, meta.n_valid, frames)
        if loop.batch_log is not None:
            log_batch(loop, batch)
        if loop.step % cfg.train.log_every == 0:
            gpu = gpu_stats() if side.mode != "cpu" else None
            log.info("%s", format_line(loop.step, loss, loop.metrics.summary(), gpu))
        if loop.step % cfg.train.checkpoint_every == 0:
            loop.checkpoints.save(loop.step, loader.cursor.to_dict(), cfg.to_yaml())
    loop.ended = "train.steps reached"


def log_batch(loop: Loop, batch: dict[str, Any]) -> None:
    """batches.jsonl: the step's batch, as the TensorFlow trainer writes it."""
    meta, host = loop.side.loader.last_meta, loop.side.host
    assert meta is not None  # set with every batch
    record = {
        "step": loop.step,
        "batch_index": meta.batch_index,
        "epochs": [meta.first_epoch, meta.epoch],
        "shape": [meta.rows, meta.frames, meta.text_len],
        "items": host(batch["items"])[: meta.n_valid].tolist(),
        "text_lens": host(batch["text_lens"])[: meta.n_valid].tolist(),
    }
    loop.batch_log.write(json.dumps(record) + "\n")
    loop.batch_log.flush()


def teardown(loop: Loop, run_id: str, stop: StopFlag) -> None:
    """Checkpoint and summary when finished (then BYE) or stopped by a signal (no BYE:
    the launcher stops the others); only close after a failure."""
    cfg, loader = loop.cfg, loop.side.loader
    finished = not stop.is_set() and loop.ended in ("train.steps reached", "end of data")
    stopped = stop.is_set() and loop.ended == "stopped"
    if stopped and stop.signal is not None:
        loop.ended = f"stopped by {signal.Signals(stop.signal).name}"
    if (finished or stopped) and loop.losses and loop.step % cfg.train.checkpoint_every:
        loop.checkpoints.save(loop.step, loader.cursor.to_dict(), cfg.to_yaml())
    cursor = loader.cursor.to_dict()
    loader.close(finished=finished)
    if loop.batch_log is not None:
        loop.batch_log.close()
    if not (finished or stopped):
        log.info("trainer %s at step %d; no summary written", loop.ended or "stopped", loop.step)
        return
    path = run_dir(cfg, run_id) / "summary.json"
    wait_s = STAGER_SUMMARY_WAIT_S if finished else STOPPED_SUMMARY_WAIT_S
    write_json_atomic(
        path, summarize(loop, read_stager_json(path.with_name("stager.json"), wait_s), cursor)
    )
    log.info("trainer done (%s) at step %d; summary %s", loop.ended, loop.step, path)


def summarize(loop: Loop, stager: dict[str, Any], cursor: dict[str, Any]) -> dict[str, Any]:
    """The TensorFlow trainer's summary.json keys that a single-process trainer has."""
    m = loop.metrics.run_summary()
    return {
        **run_numbers(loop.step, loop.losses, loop.samples, cursor, stager, m),
        "trace_count": loop.side.trace_count,
        "first_step_s": loop.first_step_s,
        "device_mode": loop.side.mode,
        "framework": type(loop.side).__name__,
        "ended": loop.ended,
        "cursor": cursor,
    }


def run(cfg: Config, run_id: str, side: ModelSide, new_plan: bool, stop: StopFlag) -> int:
    """Setup, loop and teardown of one example trainer process; its exit code."""
    try:
        loop = setup(cfg, run_id, side, new_plan)
    except (PlanMismatch, StagerRefused) as exc:
        log.error("%s", exc)
        side.loader.close(finished=False)
        return 2
    except Exception as exc:  # an unreadable checkpoint, a lost stager: say what
        log.error("trainer setup failed: %s: %s", type(exc).__name__, exc, exc_info=True)
        side.loader.close(finished=False)
        return 1
    code = 0
    try:
        train(loop, stop)
    except (PlanMismatch, StagerRefused) as exc:
        loop.ended, code = str(exc), 2
        log.error("%s", exc)
    except (StagerGone, TimeoutError) as exc:
        if stop.wait(STOP_GRACE_S):
            loop.ended = "stopped"  # the stager heard the same signal first
        else:
            loop.ended, code = f"stager lost: {exc}", 1
            log.error("%s", loop.ended)
    except Exception as exc:  # a failed step or loader: say what, exit non-zero
        loop.ended, code = f"failed: {type(exc).__name__}: {exc}", 1
        log.error("trainer %s", loop.ended, exc_info=True)
    finally:
        teardown(loop, run_id, stop)
    return code


def main(
    framework: str,
    cfg: Config,
    run_id: str,
    new_plan: bool = False,
    share: Share = ONE_WORKER,
) -> int:
    """Process entry of `ringfeed trainer --trainer torch|jax`: the model side of
    consumer/trainer/<framework>_example/trainer.py (its Side), set up and run; 0
    finished or stopped, 2 refused (the plan changed, or --worker: the log says what),
    1 on a lost stager or any error."""
    from importlib import import_module

    example = import_module(f"ringfeed.consumer.trainer.{framework}_example.trainer")
    if share.count > 1:
        log.error(
            "--worker %d/%d: %s (docs/loaders.md#several-gpus)",
            share.index,
            share.count,
            example.SEVERAL,
        )
        return 2
    stop = StopFlag().install(second_exits=True)
    try:
        side = example.Side(cfg, run_id, stop)
    except Exception as exc:
        log.error("trainer setup failed: %s: %s", type(exc).__name__, exc, exc_info=True)
        return 1
    return run(cfg, run_id, side, new_plan, stop)
