"""What the trainer wrote to TensorBoard (consumer/trainer/board.py), read back from its
event files as a user's TensorBoard reads them."""

from __future__ import annotations

import collections
from pathlib import Path


def read_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value, from every event file under folder."""
    import tensorflow as tf

    out: dict[str, dict[int, float]] = collections.defaultdict(dict)
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                out[value.tag][event.step] = float(tf.make_ndarray(value.tensor))
    return out
