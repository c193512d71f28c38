"""One compiled training step with static shapes, and the optimizer it uses.

The trainer process builds one :class:`TrainStep` and calls it once per batch.
It is a ``tf.function`` with an explicit input signature (the batch fields of
cfg, minus ``items``), so it traces once and XLA compiles once; ``trace_count``
counts traces and a test checks it stays at 1. With length buckets
(stager.buckets) there is one such function per bucket shape, each traced and
compiled once when its first batch arrives, and no more shapes than buckets
(``max_shapes``): trace_count equals the number of buckets seen. Two things
would retrace it:

- An unbuilt Keras optimizer creates its slot variables on the first
  ``apply_gradients``, inside the trace; TrainStep builds it first.
- Arrays of another shape or dtype: the signature turns those into an error
  instead of a silent recompile.

Mixed precision (float16 compute, float32 variables and loss) is used on a GPU
only: on the CPU float16 is emulated and slower. :func:`set_precision_policy`
must run before the model is built, :func:`make_optimizer` after.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from ringfeed.consumer.trainer.model import LossFn
from ringfeed.shared.config import Config
from ringfeed.shared.sample.schema import ROW_SOURCE_FIELDS

log = logging.getLogger(__name__)

# Global gradient-norm clip: attention models spike early in training; 1.0 is the
# value Tacotron 2 and Transformer-TTS implementations use.
GRAD_CLIP_NORM = 1.0


def set_precision_policy(cfg: Config) -> str:
    """Set Keras' global dtype policy for the trainer; call before building the model.

    Returns the policy name: "mixed_float16" when cfg.train.mixed_precision and a
    GPU is visible, else "float32".
    """
    gpus = tf.config.list_physical_devices("GPU")
    name = "mixed_float16" if cfg.train.mixed_precision and gpus else "float32"
    if cfg.train.mixed_precision and not gpus:
        log.info("train.mixed_precision is on but no GPU is visible: training in float32")
    keras.mixed_precision.set_global_policy(name)
    return name


def make_optimizer(cfg: Config, clip: bool = True) -> keras.optimizers.Optimizer:
    """Adam at train.learning_rate; wrapped in a LossScaleOptimizer under mixed_float16.
    clip=False: the caller clips (several replicas: consumer/trainer/replicas.py)."""
    optimizer = keras.optimizers.Adam(
        learning_rate=cfg.train.learning_rate, global_clipnorm=GRAD_CLIP_NORM if clip else None
    )
    if keras.mixed_precision.global_policy().name == "mixed_float16":
        # float16 gradients underflow to 0 without loss scaling.
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def batch_signature(cfg: Config) -> dict[str, tf.TensorSpec]:
    """TensorSpecs of the model's inputs: cfg.batch_fields() without the fields that only
    say where a row comes from (items, position)."""
    return {
        name: tf.TensorSpec(shape, tf.as_dtype(dtype), name=name)
        for name, (shape, dtype) in cfg.batch_fields().items()
        if name not in ROW_SOURCE_FIELDS
    }


def check_new_shape(key: tuple, n_compiled: int, max_shapes: int) -> None:
    """A batch shape not compiled yet must be one of the length buckets' (one XLA
    program per bucket), never a silent recompile."""
    if n_compiled >= max_shapes:
        raise ValueError(
            f"a batch of shapes {key} would be compile {n_compiled + 1}, more than the "
            f"{max_shapes} length buckets (stager.buckets)"
        )


class TrainStep:
    """Forward, loss, backward and update for one batch, traced once.

    Called by the trainer process: ``loss = step(batch)`` with batch a mapping
    of arrays as cfg.batch_fields() (extra keys such as items are ignored);
    returns the float32 scalar loss. ``signature`` defaults to the shapes of a
    functional model's inputs; pass ``batch_signature(cfg)`` for other models.
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        loss_fn: LossFn,
        jit_compile: bool,
        signature: Mapping[str, tf.TensorSpec] | None = None,
        max_shapes: int = 1,
    ) -> None:
        """max_shapes > 1: length buckets; each batch shape gets its own signature,
        and a shape beyond max_shapes is an error, not a silent recompile."""
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.jit_compile = jit_compile
        self.max_shapes = max_shapes
        self.trace_count = 0
        if max_shapes == 1:
            self.signature = dict(signature) if signature else _model_signature(model)
        else:
            self.signature = {t.name: None for t in model.inputs} if not signature else signature
        # Slots made now, not inside the first trace (which would force a retrace).
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        self._steps: dict[tuple, tf.types.experimental.GenericFunction] = {}
        if max_shapes == 1:
            self._steps[()] = self._function(self.signature)

    def _function(self, signature: Mapping[str, tf.TensorSpec]):
        return tf.function(
            self._train,
            input_signature=[dict(signature)],
            jit_compile=self.jit_compile,
            reduce_retracing=False,
        )

    def __call__(self, batch: Mapping[str, np.ndarray | tf.Tensor]) -> tf.Tensor:
        inputs = {name: batch[name] for name in self.signature}
        if self.max_shapes == 1:
            return self._steps[()](inputs)
        key = tuple(tuple(inputs[name].shape) for name in inputs)
        step = self._steps.get(key)
        if step is None:
            check_new_shape(key, len(self._steps), self.max_shapes)
            spec = {
                n: tf.TensorSpec(v.shape, tf.as_dtype(v.dtype), name=n) for n, v in inputs.items()
            }
            step = self._steps[key] = self._function(spec)
        return step(inputs)

    def _train(self, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        # Runs only while tracing: counts compilations, not steps.
        self.trace_count += 1
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            pred = self.model(batch, training=True)
            loss = tf.cast(self.loss_fn(pred, batch["mel"], batch["mel_lens"]), tf.float32)
            # Identity unless the optimizer is a LossScaleOptimizer.
            scaled = self.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, variables)
        self.optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss


def _model_signature(model: keras.Model) -> dict[str, tf.TensorSpec]:
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ValueError(
            f"{model.name} has no static inputs (subclassed model?): pass "
            "signature=batch_signature(cfg) to TrainStep"
        )
    specs = {}
    for tensor in inputs:
        name = tensor.name
        if any(dim is None for dim in tensor.shape):
            raise ValueError(
                f"model input {name!r} has shape {tensor.shape} with unknown dims; XLA needs "
                "static shapes: build the model from cfg.batch_fields() or pass signature="
            )
        specs[name] = tf.TensorSpec(tensor.shape, tf.as_dtype(tensor.dtype), name=name)
    return specs
