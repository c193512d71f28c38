"""The JAX example model: the default TensorFlow model's architecture
(consumer/trainer/model.py) in plain JAX, for `--trainer jax`; no Flax or Optax.

    tokens -> embedding + speaker and language embeddings
           -> n_layers x residual conv block (masked by text_lens)
           -> + sinusoidal positions = encoder memory [B, T, d]
    mel shifted right one frame -> prenet (dropout 0.5) -> + positions
           -> n_layers x (causal conv, cross-attention to the memory, feed-forward)
           -> dense to n_mels = predicted mel [B, F, n_mels] float32

Parameters are a dict of arrays (init), the forward pass a pure function (forward),
Adam with a global-norm clip a few lines (adam). Every shape comes from the batch, so
a jitted step compiles once per length bucket.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ringfeed.consumer.trainer.model_kwargs import DefaultModelKwargs

Params = dict[str, Any]
# As the TensorFlow model's (consumer/trainer/model.py).
PRENET_DROPOUT = 0.5
N_HEADS = 4
FFN_MULT = 4
# Adam's (Kingma and Ba 2015) defaults, as Keras's and torch's.
BETA1, BETA2, EPSILON = 0.9, 0.999, 1e-7


def _dense(key: jax.Array, n_in: int, n_out: int) -> Params:
    scale = np.sqrt(2.0 / (n_in + n_out))  # Glorot, as Keras's Dense
    return {"w": jax.random.normal(key, (n_in, n_out)) * scale, "b": jnp.zeros(n_out)}


def _conv(key: jax.Array, d: int, kernel: int) -> Params:
    scale = np.sqrt(2.0 / (2 * d * kernel))
    return {"w": jax.random.normal(key, (kernel, d, d)) * scale, "b": jnp.zeros(d)}


def _norm(d: int) -> Params:
    return {"g": jnp.ones(d), "b": jnp.zeros(d)}


def init(
    key: jax.Array, vocab: int, n_mels: int, speakers: int, languages: int, m: DefaultModelKwargs
) -> Params:
    """Fresh parameters for model.kwargs `m`."""
    keys = iter(jax.random.split(key, 16 + 16 * m.n_layers))
    d = m.d_model

    def embed(n: int) -> jax.Array:
        return jax.random.uniform(next(keys), (n, d), minval=-0.05, maxval=0.05)

    def decoder_block() -> Params:
        attn = {name: _dense(next(keys), d, d) for name in ("q", "k", "v", "o")}
        return {
            "conv": _conv(next(keys), d, m.kernel_size),
            "norm_conv": _norm(d),
            "attn": attn,
            "norm_attn": _norm(d),
            "ffn_in": _dense(next(keys), d, FFN_MULT * d),
            "ffn_out": _dense(next(keys), FFN_MULT * d, d),
            "norm_ffn": _norm(d),
        }

    return {
        "embed": embed(vocab),
        "speaker": embed(speakers),
        "language": embed(languages),
        "encoder": [
            {"conv": _conv(next(keys), d, m.kernel_size), "norm": _norm(d)}
            for _ in range(m.n_layers)
        ],
        "prenet": [_dense(next(keys), n_mels, d), _dense(next(keys), d, d)],
        "decoder": [decoder_block() for _ in range(m.n_layers)],
        "out": _dense(next(keys), d, n_mels),
    }


def positions(length: int, depth: int) -> jax.Array:
    """Sinusoidal position encoding [length, depth] (Vaswani et al. 2017, sec. 3.5)."""
    pos = np.arange(length)[:, None]
    angle = pos / np.power(10000.0, 2 * np.arange(depth // 2)[None, :] / depth)
    return jnp.asarray(np.concatenate([np.sin(angle), np.cos(angle)], -1), jnp.float32)


def dense(p: Params, x: jax.Array) -> jax.Array:
    return x @ p["w"] + p["b"]


def layer_norm(p: Params, x: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-3) * p["g"] + p["b"]  # Keras's epsilon


def conv1d(p: Params, x: jax.Array, causal: bool) -> jax.Array:
    """x [B, T, d] through a 1-D conv; causal: frame f sees frames <= f only."""
    k = p["w"].shape[0]
    pad = (k - 1, 0) if causal else ((k - 1) // 2, k // 2)
    layout = ("NWC", "WIO", "NWC")
    return jax.lax.conv_general_dilated(x, p["w"], (1,), [pad], dimension_numbers=layout) + p["b"]


def dropout(key: jax.Array | None, x: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout while training (key given), the identity otherwise."""
    if key is None or rate == 0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def attention(p: Params, x: jax.Array, memory: jax.Array, text: jax.Array, key, rate) -> jax.Array:
    """Every frame of x [B, F, d] attends to the true tokens of memory [B, T, d]."""
    b, f, d = x.shape
    heads = lambda y: y.reshape(b, y.shape[1], N_HEADS, d // N_HEADS)  # noqa: E731
    q, k, v = heads(dense(p["q"], x)), heads(dense(p["k"], memory)), heads(dense(p["v"], memory))
    scores = jnp.einsum("bfhc,bthc->bhft", q, k) / np.sqrt(d // N_HEADS)
    scores = jnp.where(text[:, None, None, :], scores, -1e9)
    weights = dropout(key, jax.nn.softmax(scores, -1), rate)
    return dense(p["o"], jnp.einsum("bhft,bthc->bfhc", weights, v).reshape(b, f, d))


def forward(
    params: Params, batch: dict[str, jax.Array], key: jax.Array | None, m: DefaultModelKwargs
) -> jax.Array:
    """The predicted mel [B, F, n_mels]; key: dropout's, None for inference."""
    keys = iter(jax.random.split(key, 4 + 4 * m.n_layers)) if key is not None else None
    drop = lambda x, rate: dropout(next(keys) if keys else None, x, rate)  # noqa: E731
    tokens, mel = batch["tokens"], batch["mel"]
    t, f = tokens.shape[1], mel.shape[1]
    # A padding row has no text: it attends to its first (zero) token, not to nothing.
    text = jnp.arange(t)[None, :] < jnp.maximum(batch["text_lens"], 1)[:, None]
    keep = text[:, :, None].astype(mel.dtype)
    who = params["speaker"][batch["speaker"]] + params["language"][batch["language"]]
    x = (params["embed"][tokens] + who[:, None]) * keep
    for p in params["encoder"]:
        y = drop(jax.nn.relu(conv1d(p["conv"], x, causal=False)), m.dropout)
        x = layer_norm(p["norm"], x + y) * keep
    memory = x + positions(t, m.d_model)
    y = jnp.pad(mel, ((0, 0), (1, 0), (0, 0)))[:, :-1]
    for p in params["prenet"]:
        y = drop(jax.nn.relu(dense(p, y)), PRENET_DROPOUT)
    y = y + positions(f, m.d_model)
    for p in params["decoder"]:
        z = drop(jax.nn.relu(conv1d(p["conv"], y, causal=True)), m.dropout)
        y = layer_norm(p["norm_conv"], y + z)
        y = layer_norm(
            p["norm_attn"],
            y + attention(p["attn"], y, memory, text, next(keys) if keys else None, m.dropout),
        )
        z = drop(dense(p["ffn_out"], jax.nn.relu(dense(p["ffn_in"], y))), m.dropout)
        y = layer_norm(p["norm_ffn"], y + z)
    return dense(params["out"], y)


def masked_l1(pred: jax.Array, target: jax.Array, mel_lens: jax.Array) -> jax.Array:
    """Mean |pred - target| over true frames only (padding frames and rows excluded)."""
    frames = (jnp.arange(target.shape[1])[None, :] < mel_lens[:, None])[:, :, None]
    total = jnp.sum(jnp.abs(pred - target) * frames)
    return total / jnp.maximum(frames.sum() * target.shape[2], 1.0)


def adam_state(params: Params) -> Params:
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"m": zeros, "v": jax.tree.map(jnp.zeros_like, params), "t": jnp.zeros((), jnp.int32)}


def adam(params: Params, grads: Params, state: Params, lr: float, clip: float):
    """One Adam step after clipping the gradients to a global norm of `clip`;
    -> (params, state)."""
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    grads = jax.tree.map(lambda g: g * jnp.minimum(1.0, clip / (norm + 1e-6)), grads)
    t = state["t"] + 1
    m = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, state["v"], grads)
    step = lr * jnp.sqrt(1 - BETA2**t) / (1 - BETA1**t)
    params = jax.tree.map(lambda p, m, v: p - step * m / (jnp.sqrt(v) + EPSILON), params, m, v)
    return params, {"m": m, "v": v, "t": t}
