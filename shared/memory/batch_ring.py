"""The batch ring's slots: their states, the layout of one batch inside a slot, and where
one row of it lies.

A batch slot's fields are flat (Config.batch_ring_fields), so one slot holds a batch
of any length bucket's shape; :func:`batch_views` is the one definition of where its
rows are. Producers write each sample straight into its row of the batch it will be
delivered in (docs/design.md#rows-written-once): :func:`row_views` is that row. The
stager (consumer/stager/assembly.py) checks the rows, writes the columns that are its
own (lengths, items, positions, valid, speaker and language ids) and announces the
batch; the batch client (consumer/client/batch_client.py) and the inspector read it.

States of a batch slot (the stager's batch assembly is their one writer)::

    FREE --a plan batch starts in it--> FILLING --every row checked--> SENT
     ^                                     |                             |
     |                                     | a row's producer may        | BATCH_FREE
     |                                     | still write: its rows move  |
     |                                     v  to another slot            |
     +--- those producers are done --- FENCED                            |
     +---------------------------------------------------------------------+
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum

import numpy as np

from ringfeed.shared.sample.schema import SampleSchema


class BatchState(IntEnum):
    """A batch slot: FREE; FILLING (its rows granted and written); SENT (announced to the
    consumer, waiting for its BATCH_FREE); FENCED (a producer the stager gave up on may
    still write one of its rows: the batch moved to another slot, and this one waits
    until that producer is known to write no more)."""

    FREE = 0
    FILLING = 1
    SENT = 2
    FENCED = 3


def batch_views(
    slot: Mapping[str, np.ndarray], rows: int, frames: int, text: int, schema: SampleSchema
) -> dict[str, np.ndarray]:
    """One batch of shape (rows, frames, text) inside a batch-ring slot whose fields are
    flat (Config.batch_ring_fields): zero-copy views, row-major from each field's start.
    The one definition of that layout (the declared schema's), for producers, the
    stager and the batch client."""
    return schema.batch_views(slot, rows, frames, text)


def row_views(
    views: Mapping[str, np.ndarray], row: int, names: tuple[str, ...]
) -> list[np.ndarray]:
    """The sample fields `names` (ring order) of row `row` of a batch's views
    (batch_views): where a producer writes one sample, [rows of the field, ...] each."""
    return [views[name][row] for name in names]
