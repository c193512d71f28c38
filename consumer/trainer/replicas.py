"""Several replicas of the model: tf.distribute fed by one batch ring per worker.

Used by the trainer process (consumer/trainer/trainer.py), which picks:

    one worker, one device     no strategy: TrainStep (train_step.py), as before
    one worker, R devices      MirroredStrategy over them (devices.model, or
                               devices.cpu_replicas logical CPUs without a GPU)
    N workers (--worker K/N)   MultiWorkerMirroredStrategy, TF_CONFIG built from
                               --cluster (every worker's host:port) and K

Each worker's stager serves its share of every global batch
(shared/run/share.py); the worker's batch is split along its rows
over its R local replicas by ``experimental_distribute_values_from_function``:
each replica takes its rows of the batch in host memory onto its device, one
copy as with a single device. Rows are padded with empty rows (lengths 0) to a
multiple of R.

The global batch's loss and gradients. Each replica weights its loss by its
share of the true mel frames of the global batch (w_r / sum w, one all-reduce
of a scalar). The weighted gradients are summed over every replica of every
worker, clipped to GRAD_CLIP_NORM by their global norm, and applied: for a loss
that is a mean over true frames (masked_l1, the default) the update is the one a
single device would make on the whole global batch, up to float rounding
(tests/process/test_replicas.py), and the loss reported is the global batch's. Keras
clips before it sums (its optimizer all-reduces inside apply_gradients), which
would clip each replica's part: so the optimizer here has no clipnorm, the sum is
ours, and what we hand the optimizer is divided by the replica count, which its
own all-reduce multiplies back. That costs a second all-reduce of the gradients
(small next to a TTS step on a GPU; to be measured there). A user loss that is a
mean over rows is weighted by frames all the same: say so in the model.

XLA: each replica's forward and backward is one jit-compiled function, traced
once per batch shape per replica (``trace_count`` = shapes x local replicas); the
all-reduces and the update run outside XLA.

Hazard: a hung collective. A worker that dies leaves the others inside an
all-reduce; ``train.collective_timeout_s`` bounds that wait (the collectives'
CommunicationOptions), the step raises, the trainer exits 1 and its launcher
stops that host's run: no worker outlives a dead one by more than the timeout.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from ringfeed.consumer.devices import DevicePlan
from ringfeed.consumer.trainer.model import LossFn
from ringfeed.consumer.trainer.train_step import GRAD_CLIP_NORM, check_new_shape
from ringfeed.shared.config import Config, ConfigError
from ringfeed.shared.run.share import Share

log = logging.getLogger(__name__)


def tf_config(share: Share, cluster: list[str]) -> dict[str, Any]:
    """TF_CONFIG for worker share.index of the cluster (every worker's host:port)."""
    if len(cluster) != share.count:
        raise ConfigError(
            f"--cluster names {len(cluster)} workers but --worker says {share.count}: "
            "give one host:port per worker, in worker order"
        )
    return {"cluster": {"worker": list(cluster)}, "task": {"type": "worker", "index": share.index}}


def make_strategy(
    cfg: Config, plan: DevicePlan, share: Share, cluster: list[str]
) -> tf.distribute.Strategy | None:
    """The strategy for this trainer process, or None for one device on one worker.
    Call after configure_tensorflow and before any other TensorFlow op."""
    if share.count > 1:
        os.environ["TF_CONFIG"] = json.dumps(tf_config(share, cluster))
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=cfg.train.collective_timeout_s
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    elif plan.replicas > 1:
        kind = "CPU" if plan.mode == "cpu" else "GPU"
        devices = [d.name for d in tf.config.list_logical_devices(kind)][: plan.replicas]
        strategy = tf.distribute.MirroredStrategy(devices)
    else:
        return None
    log.info(
        "%s: %d replicas in sync, %d here, worker %d of %d",
        type(strategy).__name__,
        strategy.num_replicas_in_sync,
        local_replicas(strategy),
        share.index,
        share.count,
    )
    return strategy


def local_replicas(strategy: tf.distribute.Strategy) -> int:
    return len(strategy.extended.worker_devices)


def check_same_step(strategy: tf.distribute.Strategy, step: int) -> None:
    """Raise unless every worker restored the same step: a worker that cannot see the
    chief's checkpoints (no shared file system) would otherwise train from other
    weights and another cursor. One all-reduce at start."""

    def value() -> tf.Tensor:
        return tf.constant([float(step), float(step) ** 2], tf.float64)

    # ReduceOp has SUM and MEAN only: n equal steps iff sum^2 == n x sum of squares.
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(value), axis=None)
    n = strategy.num_replicas_in_sync
    if float(total[0]) ** 2 != n * float(total[1]):
        raise RuntimeError(
            f"workers resumed at different steps (this one {step}, the mean "
            f"{float(total[0]) / n:.1f}): every worker must see the chief's checkpoints "
            "(run_root on a shared file system)"
        )


class DistributedStep:
    """TrainStep's interface (``loss = step(batch)``, ``trace_count``) over a strategy.

    batch: this worker's batch (arrays [rows, ...] in host memory); returns the
    global batch's loss, a float32 scalar. Extra batch fields (items, fields the
    model does not take) are left out. Build it, the model and the optimizer
    inside ``strategy.scope()``."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        model: Any,
        optimizer: Any,
        loss_fn: LossFn,
        jit_compile: bool,
        max_shapes: int = 1,
    ) -> None:
        self.strategy, self.model, self.optimizer, self.loss_fn = (
            strategy,
            model,
            optimizer,
            loss_fn,
        )
        self.max_shapes = max_shapes
        self.replicas = local_replicas(strategy)
        self.trace_count = 0
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        self.inputs = [t.name for t in model.inputs]
        self.names = self.inputs + [n for n in ("mel", "mel_lens") if n not in self.inputs]
        self._grads = tf.function(self._forward_backward, jit_compile=jit_compile)
        self._steps: dict[tuple, Any] = {}

    def __call__(self, batch: Mapping[str, np.ndarray | tf.Tensor]) -> tf.Tensor:
        inputs = {name: batch[name] for name in self.names}
        key = tuple(tuple(inputs[name].shape) for name in self.names)
        step = self._steps.get(key)
        if step is None:
            check_new_shape(key, len(self._steps), self.max_shapes)
            step = self._steps[key] = tf.function(self._step)
        return step(inputs)

    def _step(self, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        rows = batch["mel_lens"].shape[0]
        per = -(-rows // self.replicas)
        if per * self.replicas != rows:  # empty rows: lengths 0, weight 0
            pad = per * self.replicas - rows
            batch = {
                n: tf.pad(v, [[0, pad]] + [[0, 0]] * (len(v.shape) - 1)) for n, v in batch.items()
            }

        def rows_of(ctx: tf.distribute.experimental.ValueContext) -> dict[str, tf.Tensor]:
            r = ctx.replica_id_in_sync_group % self.replicas
            return {n: v[r * per : (r + 1) * per] for n, v in batch.items()}

        parts = self.strategy.experimental_distribute_values_from_function(rows_of)
        losses = self.strategy.run(self._replica_step, args=(parts,))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    def _forward_backward(self, batch: dict[str, tf.Tensor]):
        # Runs only while tracing: once per shape per replica.
        self.trace_count += 1
        variables = self.model.trainable_variables
        inputs = {n: batch[n] for n in self.inputs}
        with tf.GradientTape() as tape:
            pred = self.model(inputs, training=True)
            loss = tf.cast(self.loss_fn(pred, batch["mel"], batch["mel_lens"]), tf.float32)
            scaled = self.optimizer.scale_loss(loss)
        return loss, tape.gradient(scaled, variables)

    def _replica_step(self, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        ctx = tf.distribute.get_replica_context()
        loss, grads = self._grads(batch)
        frames = tf.cast(tf.reduce_sum(batch["mel_lens"]), tf.float32)
        share = frames / tf.maximum(ctx.all_reduce(tf.distribute.ReduceOp.SUM, frames), 1.0)
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [g * share for g in grads])
        # Under mixed precision the gradients are still multiplied by the loss scale.
        scale = getattr(self.optimizer, "dynamic_scale", 1.0)
        grads, _ = tf.clip_by_global_norm(grads, GRAD_CLIP_NORM * scale)
        n = ctx.num_replicas_in_sync  # the optimizer's own all-reduce sums n copies
        variables = self.model.trainable_variables
        self.optimizer.apply_gradients(zip([g / n for g in grads], variables, strict=True))
        return loss * share
