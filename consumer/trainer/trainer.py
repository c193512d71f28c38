"""The trainer: the model process (GPU:1 with two GPUs), entry of `ringfeed trainer`.

    setup     choose the device (before TensorFlow is imported), build model,
              optimizer, compiled step, restore the latest checkpoint and its
              data cursor, make the batch stream at that cursor
    loop      join the run; the stream's thread copies batch k + 1 while step k
              runs (consumer/client/batch_stream.py, as under the PyTorch and JAX
              loaders); get batch (time waited = data wait) -> step -> metrics ->
              log / TensorBoard every train.log_every -> checkpoint every
              train.checkpoint_every; until train.steps (counting restored
              steps), the end of a finite plan, a stop signal, or the stager gone
    teardown  final checkpoint and BYE (the stager then stops the run and
              writes stager.json), then run_dir/summary.json; stopped by a
              signal (SIGTERM, Ctrl-C), the checkpoint and summary too (no BYE:
              the launcher stops the others), so no step is lost

Resuming checks the plan: the cursor of every checkpoint holds the stager's plan
fingerprint, which the trainer sends back when it resumes; a stager whose plan
differs (dataset index, seed, buckets, length table) refuses it, and the trainer
exits 2 with what changed; with --new-plan a new plan starts at the epoch after
the checkpoint's instead.

Several replicas and workers (consumer/trainer/replicas.py): the step runs under
a tf.distribute strategy and the stream keeps batches in host memory, whence each
replica takes its rows. Every worker saves checkpoints into its own run
directory at the same steps; every worker resumes from the chief's (worker 0),
so a relaunch after a lost worker starts all of them from one cursor.

SIGTERM or Ctrl-C ends the loop at the next poll and exits 0 without a
checkpoint and without BYE: the run is not finished, and a relaunch with the
same run id resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringfeed.consumer.client.batch_client import StagerGone, StagerRefused
from ringfeed.consumer.client.batch_stream import BatchStream
from ringfeed.consumer.client.cursor import KEYS, Cursor
from ringfeed.consumer.devices import (
    DevicePlan,
    choose_device,
    configure_tensorflow,
    gpu_stats,
    import_tensorflow,
)
from ringfeed.consumer.trainer.board import RunBoard, learning_rate
from ringfeed.consumer.trainer.metrics import StepMetrics, format_line
from ringfeed.consumer.trainer.tf_batch import TfBatch, TfPlace
from ringfeed.shared.config import Config
from ringfeed.shared.config.environment import endpoints, run_dir
from ringfeed.shared.run.process import POLL_S, StopFlag, Stopped, write_json_atomic
from ringfeed.shared.run.share import ONE_WORKER, Share

log = logging.getLogger(__name__)

# How long the trainer waits for the stager's stager.json after BYE, seconds.
STAGER_SUMMARY_WAIT_S = 5.0
# The same wait for a run stopped by a signal (the launcher SIGKILLs after its grace).
STOPPED_SUMMARY_WAIT_S = 1.0
# A launcher's SIGTERM reaches every process at about the same time and the stager's
# SHUTDOWN can arrive before our own signal; this long we wait for it, seconds.
STOP_GRACE_S = 1.0


@dataclass
class Session:
    """What one trainer process builds in setup and the loop updates."""

    plan: DevicePlan
    device: str
    model: Any
    optimizer: Any
    step_fn: Any
    checkpoints: Any
    stream: BatchStream[TfBatch]
    step: int
    cursor: dict[str, Any]
    metrics: StepMetrics
    board: RunBoard
    batch_log: Any = None
    losses: list[float] = field(default_factory=list)
    samples: int = 0
    compile_s: float | None = None
    ended: str = ""
    share: Share = ONE_WORKER


def cpu_threads(cfg: Config, n_cpus: int) -> int:
    """TF intra-op threads on the CPU: train.cpu_threads, or every core (0).

    Every core, shared with the producers by the OS scheduler: producers with a
    warm cache sit idle most of the time, and reserving a core for each of them
    left the trainer one thread on a 2-core host (docs/running.md#the-cpu-trainer).
    """
    return cfg.train.cpu_threads or n_cpus


def restore(cfg: Config, checkpoints: Any) -> tuple[int, dict[str, Any]]:
    """(steps done, data cursor) of the latest checkpoint, or a fresh start at plan 0.

    cursor: {"position": next plan position, "batch_index", "epoch", "seed", "plan": the
    plan fingerprint, {} on a fresh start}. The stager checks the plan (a changed seed
    included); a checkpoint older than fingerprints is resumed unchecked, with a warning.
    """
    restored = checkpoints.restore_latest()
    step, cursor = restored if restored else (0, {})
    if restored and "plan" not in cursor:
        log.warning(
            "checkpoint of step %d has no plan fingerprint (written before ringfeed "
            "had them): resuming without checking that the dataset, seed and buckets "
            "are those it was trained on",
            step,
        )
    fresh = {"position": 0, "batch_index": 0, "epoch": 0, "seed": cfg.stager.seed, "plan": {}}
    return step, fresh | cursor


def build_step(
    cfg: Config, share: Share = ONE_WORKER, cluster: tuple[str, ...] = ()
) -> tuple[DevicePlan, str, Any, Any, Any]:
    """(device plan, precision policy, model, optimizer, compiled step) as the trainer
    builds them: the device is chosen before TensorFlow is imported. The trainer's setup
    and the benchmarks call this, so both train the same way. With several replicas or
    workers the step is a DistributedStep (its .strategy holds the strategy)."""
    plan = choose_device("trainer", cfg)
    tf = import_tensorflow()  # only now: CUDA_VISIBLE_DEVICES is set

    from ringfeed.consumer.trainer.model import load_model_factory
    from ringfeed.consumer.trainer.replicas import DistributedStep, make_strategy
    from ringfeed.consumer.trainer.train_step import TrainStep, make_optimizer, set_precision_policy

    if plan.mode == "cpu":
        tf.config.threading.set_intra_op_parallelism_threads(cpu_threads(cfg, os.cpu_count() or 1))
        # One train step is one chain of ops: parallel op dispatch buys nothing here.
        tf.config.threading.set_inter_op_parallelism_threads(1)
    configure_tensorflow(plan)
    strategy = make_strategy(cfg, plan, share, list(cluster))
    policy = set_precision_policy(cfg)
    if strategy is None:
        model, loss_fn = load_model_factory(cfg)
        optimizer = make_optimizer(cfg)
        step_fn = TrainStep(
            model, optimizer, loss_fn, cfg.train.jit_compile, max_shapes=cfg.stager.n_shapes
        )
        return plan, policy, model, optimizer, step_fn
    with strategy.scope():
        model, loss_fn = load_model_factory(cfg)
        optimizer = make_optimizer(cfg, clip=False)  # DistributedStep clips the sum
        step_fn = DistributedStep(
            strategy,
            model,
            optimizer,
            loss_fn,
            cfg.train.jit_compile,
            max_shapes=cfg.stager.n_shapes,
        )
    return plan, policy, model, optimizer, step_fn


def setup(
    cfg: Config,
    run_id: str,
    stop: StopFlag,
    new_plan: bool = False,
    share: Share = ONE_WORKER,
    cluster: tuple[str, ...] = (),
) -> Session:
    """Build everything the loop needs; called once by main. new_plan: if the plan
    changed since the checkpoint, start a new one at its next epoch (else: refused).
    share, cluster: this worker of several and every worker's host:port."""
    from ringfeed.consumer.trainer.checkpoint import CheckpointManager, chief_dir

    # TensorFlow's import and the model's build: seconds of a start that polls nothing
    # (more than the launcher's grace on a busy host). A stop signal then ends the start
    # at once; nothing is open yet that needs closing.
    with stop.raising():
        plan, policy, model, optimizer, step_fn = build_step(cfg, share, cluster)
    directory = run_dir(cfg, run_id)
    directory.mkdir(parents=True, exist_ok=True)
    checkpoints = CheckpointManager(directory, model, optimizer)
    chief = chief_dir(cfg, share, run_id)
    source = checkpoints if chief == directory else CheckpointManager(chief, model, optimizer)
    step, cursor = restore(cfg, source)
    if share.count > 1:
        from ringfeed.consumer.trainer.replicas import check_same_step

        check_same_step(step_fn.strategy, step)
    replicated = hasattr(step_fn, "strategy")
    # Replicas take their rows from host memory (replicas.py): the stream copies there.
    device = "/CPU:0" if plan.mode == "cpu" or replicated else "/GPU:0"
    new_plan_at = cursor["epoch"] + 1 if new_plan else 0
    # Not Cursor.from_dict: a changed seed is the stager's to refuse (exit 2), or to
    # take with --new-plan, as any other change of the plan.
    at = Cursor(**{key: cursor[key] for key in KEYS})
    stream = BatchStream(
        cfg, run_id, at, TfPlace(device), name="trainer", stop=stop.is_set, new_plan_at=new_plan_at
    )
    log.info(
        "trainer on %s (%s%s, %s, jit %s): %d params, step %d of %d",
        plan.visible and f"GPU {plan.visible}" or device,
        plan.mode,
        f", {cpu_threads(cfg, os.cpu_count() or 1)} CPU threads" if plan.mode == "cpu" else "",
        policy,
        cfg.train.jit_compile,
        model.count_params(),
        step,
        cfg.train.steps,
    )
    return Session(
        plan,
        device,
        model,
        optimizer,
        step_fn,
        checkpoints,
        stream,
        step,
        cursor,
        StepMetrics(),
        RunBoard(directory / "tensorboard", directory, endpoints(cfg, run_id).stats),
        batch_log=open_batch_log(directory / "batches.jsonl") if cfg.train.log_batches else None,
        share=share,
    )


def train(cfg: Config, s: Session, stop: StopFlag) -> None:
    """The loop: join, get, step, measure, log, checkpoint; sets s.ended to why it
    stopped. Joining raises StagerRefused (the plan changed) or StagerGone."""
    s.stream.connect()
    s.stream.start()
    while s.step < cfg.train.steps:
        t0 = time.perf_counter()
        got = s.stream.get()
        wait_s = time.perf_counter() - t0
        if got is None:
            s.ended = "end of data" if s.stream.ended else "stopped"
            return
        batch, meta = got
        traces = s.step_fn.trace_count
        loss = float(s.step_fn(batch.tensors))  # float() waits for the device: true step time
        step_s = time.perf_counter() - t0 - wait_s
        s.step += 1
        s.samples += meta.n_valid
        s.losses.append(loss)
        s.metrics.fill(batch.fill)
        s.board.batch(batch.speakers, batch.languages)
        if s.step_fn.trace_count != traces:
            # A step that traced and compiled (seconds under XLA; once per bucket shape)
            # stays out of the window, or it would dominate the step-time mean and CV.
            s.compile_s = step_s if s.compile_s is None else s.compile_s
        else:
            s.metrics.record(step_s, wait_s, meta.n_valid, batch.fill[0])
        s.stream.send_stats(s.step, step_s, wait_s, loss, meta.n_valid, batch.fill[0])
        s.cursor = {
            "position": meta.next_position,
            "batch_index": meta.batch_index + 1,
            "epoch": meta.epoch,
            "seed": cfg.stager.seed,
            "plan": s.stream.plan,  # what a resume must find again (shared/run/fingerprint.py)
        }
        if s.batch_log is not None:
            record = {
                "step": s.step,
                "batch_index": meta.batch_index,
                "epochs": [meta.first_epoch, meta.epoch],
                "shape": [meta.rows, meta.frames, meta.text_len],
            }
            rows = {
                "items": batch.items.tolist(),  # and their true text lengths: a row check
                "text_lens": batch.tensors["text_lens"].numpy()[: meta.n_valid].tolist(),
            }
            s.batch_log.write(json.dumps(record | rows) + "\n")
            s.batch_log.flush()
        if s.step % cfg.train.log_every == 0:
            report(s, loss)
        if s.step % cfg.train.checkpoint_every == 0:
            s.checkpoints.save(s.step, s.cursor, cfg.to_yaml())
    s.ended = "train.steps reached"


def report(s: Session, loss: float) -> None:
    """One console line and the same numbers to TensorBoard."""
    summary = s.metrics.summary()
    gpu = gpu_stats() if s.plan.mode != "cpu" else None
    log.info("%s", format_line(s.step, loss, summary, gpu))
    s.board.scalars(s.step, {"loss": loss} | summary, prefix="train/")
    s.board.report(s.step, learning_rate(s.optimizer, s.step))
    if gpu:
        s.board.scalars(s.step, gpu, prefix="gpu/")


def teardown(cfg: Config, run_id: str, s: Session, stop: StopFlag) -> Path | None:
    """Checkpoint and summary when the run ended normally (then BYE), and when a signal
    stopped it (SIGTERM, Ctrl-C: the steps since the last checkpoint are kept, and a
    relaunch resumes there); only close after a failure (its state is not to be kept)."""
    finished = not stop.is_set() and s.ended in ("train.steps reached", "end of data")
    stopped = stop.is_set() and s.ended == "stopped"
    if stopped and stop.signal is not None:
        s.ended = f"stopped by {signal.Signals(stop.signal).name}"
    if (finished or stopped) and s.losses and s.step % cfg.train.checkpoint_every != 0:
        s.checkpoints.save(s.step, s.cursor, cfg.to_yaml())
    if finished and s.losses:  # the stager's last numbers at the last step, while it runs
        s.board.report(s.step, learning_rate(s.optimizer, s.step), fresh_s=1.0)
    s.stream.close(finished)
    s.board.close()
    if s.batch_log is not None:
        s.batch_log.close()
    if not (finished or stopped):
        log.info("trainer %s at step %d; no summary written", s.ended or "stopped", s.step)
        return None
    path = run_dir(cfg, run_id) / "summary.json"
    # Stopped, the launcher waits only RINGFEED_GRACE_S: stager counters if already there.
    wait_s = STAGER_SUMMARY_WAIT_S if finished else STOPPED_SUMMARY_WAIT_S
    write_json_atomic(path, summarize(cfg, run_id, s, wait_s))
    log.info("trainer done (%s) at step %d; summary %s", s.ended, s.step, path)
    return path


def run_numbers(
    step: int,
    losses: list[float],
    samples: int,
    cursor: dict[str, Any],
    stager: dict[str, Any],
    m: dict[str, Any],
) -> dict[str, Any]:
    """The summary.json keys of every trainer (this one and the example trainers'
    consumer/trainer/model_loop.py): steps, epochs, the stager's counters (its
    stager.json), the step metrics `m` (StepMetrics.run_summary) and the losses."""
    counters, n_items = stager.get("counters", {}), stager.get("n_items")
    return {
        "steps": step,
        "steps_this_run": len(losses),
        "samples": samples,
        "epochs": cursor["position"] / n_items if n_items else None,
        "delivered": counters.get("delivered"),
        "skipped": counters.get("skipped"),
        "data_wait_fraction": m["wait_frac"],
        "step_time_s": m["step_time_s"],
        "step_time_cv": m["step_time_cv"],
        "step_time_median_s": m["step_time_median_s"],
        "samples_per_s": m["samples_per_s"],
        "useful_frames_per_s": m["useful_frames_per_s"],
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
    }


def summarize(cfg: Config, run_id: str, s: Session, wait_s: float) -> dict[str, Any]:
    """The run's numbers; stager counters come from stager.json, written after our BYE
    (waited for up to wait_s)."""
    stager = read_stager_json(run_dir(cfg, run_id) / "stager.json", wait_s)
    m = s.metrics.run_summary()
    return {
        **run_numbers(s.step, s.losses, s.samples, s.cursor, stager, m),
        "padding_efficiency_frames": m["padding_efficiency_frames"],
        "padding_efficiency_text": m["padding_efficiency_text"],
        "trace_count": s.step_fn.trace_count,
        "first_step_s": s.compile_s,
        "device_mode": s.plan.mode,
        **replica_summary(s, m["wait_frac"]),
        "ended": s.ended,
        "cursor": s.cursor,
    }


def replica_summary(s: Session, wait_frac: float | None) -> dict[str, Any]:
    """How many replicas and workers trained, and every local replica's data wait: the
    replicas of one worker share its stream, so each waits what the worker waits."""
    strategy = getattr(s.step_fn, "strategy", None)
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    local = getattr(s.step_fn, "replicas", 1)
    first = s.share.index * local
    return {
        "replicas": replicas,
        "workers": s.share.count,
        "worker": s.share.index,
        "replica_data_wait_fraction": {str(first + r): wait_frac for r in range(local)},
    }


def read_stager_json(path: Path, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            log.warning("no %s after %.0f s: summary lacks stager counters", path, timeout_s)
            return {}
        time.sleep(POLL_S)
    return json.loads(path.read_text())


def open_batch_log(path: Path):
    # A SIGKILLed trainer can leave half a line: start ours on a fresh one.
    torn = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    f = path.open("a")
    if torn:
        f.write("\n")
    return f


def main(
    cfg: Config,
    run_id: str,
    new_plan: bool = False,
    share: Share = ONE_WORKER,
    cluster: tuple[str, ...] = (),
) -> int:
    """Process entry of `ringfeed trainer`: 0 when finished or stopped, 2 when the stager
    refused to resume (the plan changed: the log says what), 1 on a lost stager, a lost
    peer worker (train.collective_timeout_s) or any error (the launcher then stops the
    whole run). share, cluster: `--worker K/N --cluster HOST:PORT,...`."""
    stop = StopFlag().install(second_exits=True)
    try:
        s = setup(cfg, run_id, stop, new_plan, share, cluster)
    except Stopped as exc:  # a signal while TensorFlow loaded: a stop like any other
        log.info("trainer %s; no step taken", exc)
        return 0
    except Exception as exc:
        log.error("trainer setup failed: %s: %s", type(exc).__name__, exc, exc_info=True)
        return 1
    code = 0
    try:
        train(cfg, s, stop)
    except StagerRefused as exc:
        s.ended = str(exc)
        log.error("%s", exc)
        code = 2
    except (StagerGone, TimeoutError) as exc:
        if stop.wait(STOP_GRACE_S):
            s.ended = "stopped"  # the stager heard the same signal first
        else:
            s.ended = f"stager lost: {exc}"
            log.error("%s", s.ended)
            code = 1
    except Exception as exc:  # a failed step or stream: say what, exit non-zero
        s.ended = f"failed: {type(exc).__name__}: {exc}"
        log.error("trainer %s", s.ended, exc_info=True)
        code = 1
    finally:
        teardown(cfg, run_id, s, stop)
    return code
