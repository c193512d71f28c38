"""Checks of a producer's READY, before the stager lets it count.

Pure functions called by the stager's intake (consumer/stager/intake.py): check
true lengths against the slot's limits, check a remote READY's raw payload
frames against the granted slot, and copy them in.
A READY that fails for a slot its producer holds costs that producer its
grants at once (the stager revokes them), so a bad READY never waits out a
lease and never leaves a slot or item held.
"""

from __future__ import annotations

import numpy as np

from ringfeed.shared.memory.ring import FieldSpec, Ring


def row_limits(fields: FieldSpec) -> list[int]:
    """Rows each field of a slot holds: the most a READY may claim."""
    return [shape[0] for shape, _ in fields.values()]


def lengths_error(lengths: list[int], limits: list[int]) -> str:
    """'' if every true length is in 1..its field's rows (row_limits), else why not."""
    if all(0 < n <= lim for n, lim in zip(lengths, limits, strict=True)):
        return ""
    return f"READY lengths {lengths} outside 1..{limits}"


def payload_error(fields: FieldSpec, lengths: list[int], payload: list[bytes]) -> str:
    """'' if a remote READY's frames are exactly the used rows of each field."""
    if len(payload) != len(fields):
        return f"remote READY with {len(payload)} payload frames, need {len(fields)}"
    why = lengths_error(lengths, row_limits(fields))
    if why:
        return why
    for (name, (shape, dtype)), n, frame in zip(fields.items(), lengths, payload, strict=True):
        row_bytes = int(np.prod(shape[1:])) * dtype.itemsize
        if len(frame) != n * row_bytes:
            return f"{name} frame of {len(frame)} bytes, need {n * row_bytes}"
    return ""


def copy_payload(
    ring: Ring, slot: int, generation: int, lengths: list[int], payload: list[bytes]
) -> None:
    """Write checked payload frames into `slot` (the used rows; nothing reads past them)
    and seal it as its remote producer would have (the stager writes for it)."""
    header = ring.slots[slot]
    header["writing_generation"] = generation
    for name, n, frame in zip(ring.fields, lengths, payload, strict=True):
        dst = ring.view(name)[slot]
        dst[:n] = np.frombuffer(frame, dtype=dst.dtype).reshape(dst[:n].shape)
    header["sealed_generation"] = generation
