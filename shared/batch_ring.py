"""The batch ring's slots: their states and the layout of one batch inside a slot.

Written by the stager's batch builder (consumer/stager/batch_builder.py) only;
read by the batch client (consumer/client/batch_client.py) and the inspector.
A batch slot's fields are flat (Config.batch_ring_fields), so one slot holds a
batch of any length bucket's shape; :func:`batch_views` is the one definition
of where its rows are.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum

import numpy as np


class BatchState(IntEnum):
    """A batch slot: FREE, FILLING (rows being copied in), or SENT (announced to the
    consumer, waiting for its BATCH_FREE)."""

    FREE = 0
    FILLING = 1
    SENT = 2


def batch_views(
    slot: Mapping[str, np.ndarray], rows: int, frames: int, text: int
) -> dict[str, np.ndarray]:
    """One batch of shape (rows, frames, text) inside a batch-ring slot whose fields are
    flat (Config.batch_ring_fields): zero-copy views, row-major from each field's start.
    The one definition of that layout, for the stager's builder and the batch client."""
    mel = slot["mel"]
    return {
        "tokens": slot["tokens"][: rows * text].reshape(rows, text),
        "text_lens": slot["text_lens"][:rows],
        "mel": mel[: rows * frames].reshape(rows, frames, mel.shape[-1]),
        "mel_lens": slot["mel_lens"][:rows],
        "items": slot["items"][:rows],
        "speaker": slot["speaker"][:rows],
        "language": slot["language"][:rows],
    }
