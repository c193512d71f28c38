"""The default text-to-mel model, its loss, and the hook for a user's model.

The trainer process builds its model with :func:`load_model_factory`, which
imports ``cfg.model.factory`` ("module:function"). The default,
:func:`build_default_model`, is a small real text-to-mel model (~1.2 M
parameters at d_model 128, n_layers 3) in the Tacotron/Transformer-TTS family:

    tokens -> embedding + speaker and language embeddings
           -> n_layers x residual conv block (masked by text_lens)
           -> + sinusoidal positions = encoder memory [B, T, d]
    mel shifted right one frame -> prenet -> + positions
           -> n_layers x (causal conv, cross-attention to the memory, feed-forward)
           -> dense to n_mels = predicted mel [B, F, n_mels] float32

Teacher forcing: the decoder sees the true previous frame, and its convs are
causal so frame f never sees frames >= f. Shapes are static (from cfg) so XLA
compiles the step once; with length buckets the inputs' batch and length dims
are None and each bucket's shape compiles once (train_step.TrainStep).

A factory is called as ``factory(cfg, **cfg.model.kwargs)``: its own
hyper-parameters live in the config's ``model.kwargs`` mapping (the default
model's are :class:`DefaultModelKwargs`). A user's factory returns a
keras.Model taking the same input dict (tokens, text_lens, mel, mel_lens,
speaker, language; it may leave out the ids it has no use for) and
returning [B, F, n_mels], or a tuple (model, loss_fn) with
loss_fn(pred, target, mel_lens) -> scalar.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

from ringfeed.consumer.trainer.model_kwargs import DefaultModelKwargs, default_model_kwargs
from ringfeed.shared.config import Config
from ringfeed.shared.config.loader import ConfigError

LossFn = Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor]

# Tacotron 2 (Shen et al. 2018, sec. 2.3) keeps prenet dropout at 0.5: without it a
# teacher-forced decoder learns to copy the previous frame and ignores the text.
PRENET_DROPOUT = 0.5
N_HEADS = 4
FFN_MULT = 4


def masked_l1(pred: tf.Tensor, target: tf.Tensor, mel_lens: tf.Tensor) -> tf.Tensor:
    """Mean |pred - target| over true frames only, float32 scalar.

    pred, target: [B, F, n_mels] log-mel; mel_lens: [B] int32 true frame counts.
    Padding frames (>= mel_lens) are excluded whatever their value.
    """
    pred = tf.cast(pred, tf.float32)
    target = tf.cast(target, tf.float32)
    frames = tf.sequence_mask(mel_lens, tf.shape(target)[1], dtype=tf.float32)[:, :, None]
    n_mels = tf.cast(tf.shape(target)[2], tf.float32)
    total = tf.reduce_sum(tf.abs(pred - target) * frames)
    # max(.., 1) keeps an all-empty batch from dividing by zero.
    return total / tf.maximum(tf.reduce_sum(frames) * n_mels, 1.0)


def _positions(length: int, depth: int) -> np.ndarray:
    """Sinusoidal position encoding [length, depth] (Vaswani et al. 2017, sec. 3.5)."""
    pos = np.arange(length)[:, None]
    i = np.arange(depth // 2)[None, :]
    angle = pos / np.power(10000.0, 2 * i / depth)
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=-1).astype(np.float32)


class LengthMask(layers.Layer):
    """(lens [B], sequence [B, T, ...]) -> [B, T] bool, True inside the true length.
    T comes from the sequence, so one model serves every length bucket's shape."""

    def call(self, lens, sequence):
        n = ops.shape(sequence)[1]
        return ops.less(ops.arange(n)[None, :], ops.expand_dims(lens, 1))


class AddPositions(layers.Layer):
    """x [B, T, depth] -> x + sinusoidal positions [T, depth], for any T <= max_len."""

    def __init__(self, max_len: int, depth: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.max_len, self.depth = max_len, depth
        self.table = _positions(max_len, depth)

    def call(self, x):
        n = ops.shape(x)[1]
        pe = ops.slice(ops.convert_to_tensor(self.table), [0, 0], [n, self.depth])
        return x + ops.cast(pe, x.dtype)[None]

    def get_config(self) -> dict:
        return super().get_config() | {"max_len": self.max_len, "depth": self.depth}


class AttentionMask(layers.Layer):
    """(text_mask [B, T], frames [B, F, ...]) -> [B, F, T]: every frame may attend to
    every true token, never to padding."""

    def call(self, text_mask, frames):
        shape = ops.shape(text_mask)
        n = ops.shape(frames)[1]
        return ops.broadcast_to(ops.expand_dims(text_mask, 1), (shape[0], n, shape[1]))


def _identity(inputs, cfg: Config, m: DefaultModelKwargs):
    """Speaker plus language embedding [B, 1, d]: who speaks and in which language, added
    to every token so each layer of the encoder and the decoder's attention sees it. The
    tables have data.max_speakers and data.max_languages rows, fixed so that a run whose
    id table grows (data.new_ids: append) keeps its weights' shapes."""
    speaker = layers.Embedding(cfg.data.max_speakers, m.d_model, name="speaker_embed")
    language = layers.Embedding(cfg.data.max_languages, m.d_model, name="language_embed")
    both = layers.Add(name="identity")([speaker(inputs["speaker"]), language(inputs["language"])])
    return ops.expand_dims(both, 1)


def _encoder(inputs, text_mask, cfg: Config, m: DefaultModelKwargs, name: str = "enc"):
    keep = ops.expand_dims(ops.cast(text_mask, "float32"), -1)
    x = layers.Embedding(cfg.vocab_size, m.d_model, name=f"{name}_embed")(inputs["tokens"])
    x = (x + ops.cast(_identity(inputs, cfg, m), x.dtype)) * ops.cast(keep, x.dtype)
    for i in range(m.n_layers):
        y = layers.Conv1D(m.d_model, m.kernel_size, padding="same", name=f"{name}_conv{i}")(x)
        y = layers.ReLU()(y)
        y = layers.Dropout(m.dropout)(y)
        x = layers.LayerNormalization(name=f"{name}_norm{i}")(x + y)
        # Zero padded tokens so the same-padded convs do not smear them into the text.
        x = x * ops.cast(keep, x.dtype)
    return AddPositions(cfg.text.max_text_len, m.d_model, name=f"{name}_positions")(x)


def _decoder_block(x, memory, attn_mask, m: DefaultModelKwargs, i: int):
    y = layers.Conv1D(m.d_model, m.kernel_size, padding="causal", name=f"dec_conv{i}")(x)
    y = layers.Dropout(m.dropout)(layers.ReLU()(y))
    x = layers.LayerNormalization(name=f"dec_norm_conv{i}")(x + y)
    attn = layers.MultiHeadAttention(
        N_HEADS, m.d_model // N_HEADS, dropout=m.dropout, name=f"dec_attn{i}"
    )
    y = attn(query=x, value=memory, key=memory, attention_mask=attn_mask)
    x = layers.LayerNormalization(name=f"dec_norm_attn{i}")(x + y)
    y = layers.Dense(FFN_MULT * m.d_model, activation="relu", name=f"dec_ffn_in{i}")(x)
    y = layers.Dropout(m.dropout)(layers.Dense(m.d_model, name=f"dec_ffn_out{i}")(y))
    return layers.LayerNormalization(name=f"dec_norm_ffn{i}")(x + y)


# The batch fields the default model reads; it ignores the others (reference clips,
# pitch, energy, the user's), which a model of one's own takes by name.
DEFAULT_INPUTS = ("tokens", "text_lens", "mel", "mel_lens", "speaker", "language")


def model_inputs(
    cfg: Config, names: tuple[str, ...] = DEFAULT_INPUTS
) -> dict[str, keras.KerasTensor]:
    """keras.Inputs for the batch fields `names`, shaped as the declared schema says
    (cfg.schema.batch_specs): static, or with length buckets None for the batch and
    length dims (each bucket's shape is then static in its own compiled step)."""
    specs = cfg.schema.batch_specs(cfg.stager.batch_size, cfg.stager.bucketed)
    return {
        name: keras.Input(batch_shape=specs[name][0], dtype=specs[name][1].name, name=name)
        for name in names
    }


def build_default_model(cfg: Config, **kwargs: Any) -> keras.Model:
    """The default text-to-mel model; called by the trainer via load_model_factory
    with model.kwargs (DefaultModelKwargs: d_model, n_layers, kernel_size, dropout).

    Inputs: tokens int32 [B, T], text_lens int32 [B], mel float32 [B, F, n_mels]
    (teacher forcing), mel_lens int32 [B], speaker and language int32 [B] (ids in
    the run's tables, embedded and added to the encoder). Output: mel float32
    [B, F, n_mels].
    """
    m = default_model_kwargs(kwargs)
    inputs = model_inputs(cfg)
    text_mask = LengthMask(name="text_mask")(inputs["text_lens"], inputs["tokens"])
    memory = _encoder(inputs, text_mask, cfg, m)

    # Frame f is predicted from frames < f: shift right, a zero "go" frame first.
    previous = ops.pad(inputs["mel"], [[0, 0], [1, 0], [0, 0]])[:, :-1, :]
    x = layers.Dense(m.d_model, activation="relu", name="prenet0")(previous)
    x = layers.Dropout(PRENET_DROPOUT)(x)
    x = layers.Dense(m.d_model, activation="relu", name="prenet1")(x)
    x = layers.Dropout(PRENET_DROPOUT)(x)
    x = AddPositions(cfg.features.max_frames, m.d_model, name="dec_positions")(x)
    attn_mask = AttentionMask(name="attn_mask")(text_mask, x)
    for i in range(m.n_layers):
        x = _decoder_block(x, memory, attn_mask, m, i)
    mel = layers.Dense(cfg.features.n_mels, name="mel_out")(x)
    # Under mixed_float16 the loss must see float32.
    mel = layers.Activation("linear", dtype="float32", name="mel_float32")(mel)
    return keras.Model(inputs, mel, name="default_tts")


def load_model_factory(cfg: Config) -> tuple[keras.Model, LossFn]:
    """Import cfg.model.factory ("module:function") and call it with cfg and
    model.kwargs; returns (model, loss_fn).

    Called once by the trainer process after the precision policy is set. A
    factory returning only a model gets masked_l1 as its loss.
    """
    spec = cfg.model.factory
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"model.factory={spec!r}: write it as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"model.factory={spec!r}: cannot import {module_name}: {exc}") from exc
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise ValueError(f"model.factory={spec!r}: {module_name} has no function {func_name}")
    kwargs = cfg.model.kwargs
    try:
        inspect.signature(factory).bind(cfg, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"model.kwargs: {spec} does not take {sorted(kwargs)}: {exc}") from None
    built = factory(cfg, **kwargs)
    model, loss_fn = built if isinstance(built, tuple) else (built, masked_l1)
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"model.factory={spec!r} returned {type(model).__name__}; "
            "it must return a keras.Model or (keras.Model, loss_fn)"
        )
    return model, loss_fn
