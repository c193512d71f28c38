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

from ringfeed.shared.sample.schema import SampleSchema


class BatchState(IntEnum):
    """A batch slot: FREE, FILLING (rows being copied in), or SENT (announced to the
    consumer, waiting for its BATCH_FREE)."""

    FREE = 0
    FILLING = 1
    SENT = 2


def batch_views(
    slot: Mapping[str, np.ndarray], rows: int, frames: int, text: int, schema: SampleSchema
) -> dict[str, np.ndarray]:
    """One batch of shape (rows, frames, text) inside a batch-ring slot whose fields are
    flat (Config.batch_ring_fields): zero-copy views, row-major from each field's start.
    The one definition of that layout (the declared schema's), for the stager's builder
    and the batch client."""
    return schema.batch_views(slot, rows, frames, text)
