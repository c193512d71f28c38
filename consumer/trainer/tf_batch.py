"""A batch on the TensorFlow trainer's device: what the trainer's `place` makes in the
prefetch thread every model process shares (consumer/client/batch_stream.py), where
the PyTorch and JAX loaders make theirs (consumer/client/torch_loader.py, jax_loader.py).

    stream = BatchStream(cfg, run_id, cursor, TfPlace("/GPU:0"), name="trainer")
    batch, meta = stream.get()       # a TfBatch, and the stager's BATCH_READY

The copy is a real one, made before the slot is freed: TensorFlow has no way to read
a registered host buffer in place (the ring pinned in place is the PyTorch and JAX
loaders'), and on the CPU tf.constant may alias an aligned numpy buffer, while on a GPU
its copy to the device can be asynchronous: either way a tensor would still read the
slot after the stager refilled it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class TfBatch:
    """One batch copied to the trainer's device.

    tensors: name -> tf.Tensor as cfg.batch_fields() ([B, ...], on the device);
    items: int64 [n_valid] the plan items of the real rows (those `valid` says: the
    first n_valid, the stager's BATCH_READY n_valid; padding rows come last).
    """

    tensors: dict[str, Any]
    items: np.ndarray
    # (true mel frames, padded mel frames, true tokens, padded tokens) of its rows.
    fill: tuple[int, int, int, int] = (0, 0, 0, 0)
    # The real rows' speaker and language ids, for TensorBoard (None: not in the batch).
    speakers: np.ndarray | None = None
    languages: np.ndarray | None = None


class TfPlace:
    """The trainer's `place` (batch_stream.py's Place): a batch's views copied into
    tensors on `device` ("/GPU:0"; "/CPU:0" on the CPU and for several replicas, which
    take their rows from host memory: replicas.py)."""

    def __init__(self, device: str) -> None:
        self.device = device

    def __call__(self, arrays: dict[str, np.ndarray]) -> tuple[TfBatch, None]:
        """In the stream's thread: (the batch, None: nothing reads the slot after)."""
        import tensorflow as tf

        # np.array(copy=True) first: tf.constant may alias the slot (the module's docstring).
        with tf.device(self.device):
            tensors = {name: tf.constant(np.array(a, copy=True)) for name, a in arrays.items()}
        fill = (
            int(arrays["mel_lens"].sum()),
            arrays["mel"].shape[0] * arrays["mel"].shape[1],
            int(arrays["text_lens"].sum()),
            arrays["tokens"].size,
        )
        n = int(arrays["valid"].sum())  # the real rows: the first n
        items, speakers, languages = (
            np.array(arrays[k][:n], copy=True) if k in arrays else None
            for k in ("items", "speaker", "language")
        )
        return TfBatch(tensors, items, fill, speakers, languages), None
