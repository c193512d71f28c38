"""One pass over a sample's rows: the copy (where there is one), the value check and the
checksum together.

The checksum is the protocol's (a READY's ``checksum``, shared/wire/grants.py): what a
producer says of the rows it wrote, and what the stager computes again over the rows it
is about to send (docs/design.md#contract-7). The value check is shared/sample/content.py's
rule: token ids inside the vocabulary, float values finite and within +-MAX_ABS. Both are
needed on every row: the checksum catches a torn row (a stale writer's bytes), the check
a producer that skipped its own (a bug or a lie). Reading a 256 KB row once for both,
instead of xxh3 and a min and a max apart, is what the pass is for
(shared/memory/_row_pass.c, a C extension built when ringfeed is installed: numba's first
call had cost every stager and pool 0.6-2 s of CPU at start).

The checksum of a field's used rows is a hash of their bytes in 64 lanes of 32-bit
FNV-1a (word i goes to lane i % 64: the lanes are independent, so the loop runs at the
speed of the vector units, where a serial hash of the same bytes took 74 us a row),
the bytes past the last whole word into lane 0, the lanes folded with the byte count
into 64 bits. A row's checksum folds its fields' in ring order, 52 bits (a protocol
integer). Any change of one word changes its lane's hash (FNV-1a is a bijection of the
lane for each word), so a torn row is never missed for want of mixing; two changes
cancel with probability about 2**-32.

Who calls: producers (producer/process/slot_writer.py: the copy into the place), the
stager (consumer/stager/assembly.py: every row of a batch before it is sent;
consumer/stager/intake.py: a remote producer's frames as they land, a dead producer's
rows), and the tests' peers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ringfeed.shared.memory import _row_pass
from ringfeed.shared.sample.content import MAX_ABS, content_error

FNV64_BASIS, FNV64_PRIME = 14695981039346656037, 1099511628211
# A field's kind, for its check: no values bounded, token ids, float32 values.
PLAIN, TOKENS, FLOAT32 = 0, 1, 2
# The bits of float32 MAX_ABS: a float32's bits with the sign cleared are at most this
# exactly when it is finite and within +-MAX_ABS (NaN and inf have every exponent bit).
FLOAT_LIMIT = int(np.array(MAX_ABS, np.float32).view(np.uint32))
_P64 = np.uint64(FNV64_PRIME)


def field_kind(name: str, dtype: np.dtype, vocab_size: int) -> tuple[int, int]:
    """(kind, limit) of a field's check (shared/sample/content.py's rule): tokens below
    the vocabulary, float32 values by their bits, others not bounded here (a float of
    another width is checked by content_error: see check_fields)."""
    if name == "tokens":
        return TOKENS, vocab_size
    if dtype == np.float32:
        return FLOAT32, FLOAT_LIMIT
    return PLAIN, 0


def _bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


_MASK64 = (1 << 64) - 1


def fold(field_hashes: Sequence[int]) -> int:
    """A row's checksum from its fields' hashes in ring order: 52 bits."""
    acc = FNV64_BASIS
    for h in field_hashes:
        acc = ((acc ^ int(h)) * FNV64_PRIME) & _MASK64
    return acc >> 12


def fold_rows(field_hashes: Sequence[np.ndarray]) -> np.ndarray:
    """fold() of a batch's rows at once: uint64 [rows] per field -> int64 [rows]."""
    acc = np.full(len(field_hashes[0]), FNV64_BASIS, np.uint64)
    for h in field_hashes:
        acc = np.multiply(acc ^ h, _P64)  # wraps modulo 2**64, as fold's mask does
    return (acc >> np.uint64(12)).astype(np.int64)


def check_fields(
    names: Sequence[str],
    used: Sequence[np.ndarray],
    vocab_size: int,
    dst: Sequence[np.ndarray] | None = None,
) -> tuple[int, str]:
    """The used rows of one sample's fields (ring order), checked and hashed in one pass
    (copied first into dst's fields where given, from their first row on): (checksum,
    '' or why the values are out of range, as content_error says)."""
    hashes, bad = [], False
    for k, name in enumerate(names):
        src = used[k]
        if not src.flags.c_contiguous:
            src = np.ascontiguousarray(src)
        if name == "tokens":
            kind, limit = TOKENS, vocab_size
        elif src.dtype == np.float32:
            kind, limit = FLOAT32, FLOAT_LIMIT
        else:
            kind, limit = PLAIN, 0
            bad |= src.dtype.kind == "f"  # a float of another width: content_error says
        raw = src.reshape(-1).view(np.uint8)
        out = None if dst is None else _place(dst[k], src, name)
        h, ok = _row_pass.field(raw, out, kind, limit)
        hashes.append(h)
        bad |= not ok
    why = content_error(zip(names, used, strict=True), vocab_size) if bad else ""
    return fold(hashes), why


def _place(dst: np.ndarray, src: np.ndarray, name: str) -> np.ndarray:
    """The bytes of dst's first len(src) rows, which src's must fit exactly."""
    if src.shape[1:] != dst.shape[1:] or len(src) > len(dst) or src.dtype != dst.dtype:
        raise ValueError(
            f"{name} rows {src.dtype} {list(src.shape)} do not fit a place of "
            f"{dst.dtype} {list(dst.shape)}"
        )
    return dst[: len(src)].reshape(-1).view(np.uint8)


def rows_checksum(arrays: Sequence[np.ndarray]) -> int:
    """The checksum of one sample's used rows (fields in ring order), as check_fields gives
    it, without the check (a peer that lies in tests; a place's rows read back)."""
    hashes = []
    for a in arrays:
        raw = _bytes(np.ascontiguousarray(a))
        hashes.append(_row_pass.field(raw, None, PLAIN, 0)[0])
    return fold(hashes)


def check_rows(
    field: np.ndarray, rows: np.ndarray, lengths: np.ndarray, name: str, vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """One field of a batch as it lies in its slot (field [batch rows, length, ...]): for
    rows `rows` (int [n]) with lengths `lengths` (int [n], its used rows), their hashes
    (uint64 [n]) and whether their values pass (bool [n]), one pass over each."""
    flat = field.reshape(field.shape[0], -1).view(np.uint8)
    row_bytes = math.prod(field.shape[2:]) * field.dtype.itemsize
    kind, limit = field_kind(name, field.dtype, vocab_size)
    hashes = np.empty(len(rows), np.uint64)
    ok = np.empty(len(rows), np.bool_)
    used = lengths.astype(np.int64) * row_bytes
    _row_pass.rows(flat, flat.shape[1], rows.astype(np.int64), used, kind, limit, hashes, ok)
    if kind == PLAIN and field.dtype.kind == "f":  # a float of another width: numpy's check
        for i, (r, n) in enumerate(zip(rows.tolist(), lengths.tolist(), strict=True)):
            ok[i] = not content_error([(name, field[r][:n])], vocab_size)
    return hashes, ok
