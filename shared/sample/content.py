"""What a sample's rows may hold: token ids inside the vocabulary, finite floats.

Checked twice (docs/design.md#contract-10). The producer checks each sample
before it sends it: one that fails is skipped with the reason, like any bad
input, so an honest producer never sends one. The stager checks the rows it
copied into a batch: one that fails there comes from a producer that skipped
the first check (a bug or a lie), which costs that producer a strike; the same
bad rows from a second producer make the item quarantined.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

# Floor of the mel power before its log: log(max(mel, LOG_FLOOR)), so silence is
# log(1e-5) = -11.5 and never log(0). One constant for producers (producer/features/mel.py)
# and the stager's GPU mels (consumer/stager/gpu_mel.py), which must agree.
LOG_FLOOR = 1e-5

# No log-mel or waveform value comes near this; a float beyond it is garbage.
MAX_ABS = 1e4


def content_error(
    rows: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]], vocab_size: int
) -> str:
    """'' if every used row is in range, else why not. rows: field name -> used rows (a
    mapping, or its (name, rows) pairs); 'tokens' holds token ids (0 <= id < vocab_size),
    float fields finite values; other fields are not bounded."""
    pairs = rows.items() if isinstance(rows, Mapping) else rows
    for name, x in pairs:
        if not x.size or (name != "tokens" and x.dtype.kind != "f"):
            continue
        # NaN propagates: every comparison below fails. The ufuncs themselves, as this
        # runs twice a sample at the ring's full rate (ndarray.min adds a Python layer).
        lo, hi = np.minimum.reduce(x, axis=None), np.maximum.reduce(x, axis=None)
        if name == "tokens":
            if not (lo >= 0 and hi < vocab_size):
                return f"token ids {lo}..{hi} outside the vocabulary 0..{vocab_size - 1}"
        elif not (lo >= -MAX_ABS and hi <= MAX_ABS):
            return f"{name} values {lo}..{hi}: not finite, or beyond +-{MAX_ABS:g}"
    return ""
