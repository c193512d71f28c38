"""One pass over a sample's rows: the copy (where there is one), the value check and the
checksum together.

The checksum is the protocol's (a READY's ``checksum``, shared/wire/grants.py): what a
producer says of the rows it wrote, and what the stager computes again over the rows it
is about to send (docs/design.md#contract-7). The value check is shared/sample/content.py's
rule: token ids inside the vocabulary, float values finite and within +-MAX_ABS. Both are
needed on every row: the checksum catches a torn row (a stale writer's bytes), the check
a producer that skipped its own (a bug or a lie). Reading a 256 KB row once for both,
instead of xxh3 and a min and a max apart, is what these kernels are for (numba,
compiled once per host into numba's cache: scripts/setup.sh compiles them).

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
from numba import njit

from ringfeed.shared.sample.content import MAX_ABS, content_error

LANES = 64
FNV32_BASIS, FNV32_PRIME = 2166136261, 16777619
FNV64_BASIS, FNV64_PRIME = 14695981039346656037, 1099511628211
# A field's kind, for its check: no values bounded, token ids, float32 values.
PLAIN, TOKENS, FLOAT32 = 0, 1, 2
# The bits of float32 MAX_ABS: a float32's bits with the sign cleared are at most this
# exactly when it is finite and within +-MAX_ABS (NaN and inf have every exponent bit).
FLOAT_LIMIT = int(np.array(MAX_ABS, np.float32).view(np.uint32))
_P64 = np.uint64(FNV64_PRIME)


@njit(cache=True, boundscheck=False, nogil=True)
def _pass(src, dst, copy, kind, limit):  # pragma: no cover  (compiled: tested by its callers)
    """src: uint8 [n] (the used bytes of one field; may be read-only); copy: into dst,
    uint8 [>= n] (else dst is any small writable array, untouched); kind, limit: the
    field's check (PLAIN, TOKENS below `limit`, FLOAT32 bits at most `limit`). Returns
    (hash, ok)."""
    n = src.shape[0]
    n_words = n // 4
    words = src[: n_words * 4].view(np.uint32)
    out = dst[: n_words * 4].view(np.uint32)
    h = np.empty(LANES, np.uint32)
    for j in range(LANES):
        h[j] = np.uint32(FNV32_BASIS + j)
    top = np.zeros(LANES, np.uint32)  # FLOAT32: the largest abs bits; TOKENS: the largest id
    low = np.zeros(LANES, np.int32)  # TOKENS: the smallest id
    p = np.uint32(FNV32_PRIME)
    mask = np.uint32(0x7FFFFFFF)
    blocks = n_words // LANES
    for i in range(blocks):
        base = i * LANES
        if copy:
            for j in range(LANES):
                out[base + j] = words[base + j]
        if kind == 2:
            for j in range(LANES):
                w = words[base + j]
                b = w & mask
                top[j] = b if b > top[j] else top[j]
                h[j] = (h[j] ^ w) * p
        elif kind == 1:
            for j in range(LANES):
                w = words[base + j]
                v = np.int32(w)
                low[j] = v if v < low[j] else low[j]
                top[j] = w if np.int32(w) > np.int32(top[j]) else top[j]
                h[j] = (h[j] ^ w) * p
        else:
            for j in range(LANES):
                h[j] = (h[j] ^ words[base + j]) * p
    for i in range(blocks * LANES, n_words):  # the words past the last whole block
        w = words[i]
        if copy:
            out[i] = w
        j = i % LANES
        if kind == 2:
            b = w & mask
            top[j] = b if b > top[j] else top[j]
        elif kind == 1:
            v = np.int32(w)
            low[j] = v if v < low[j] else low[j]
            top[j] = w if np.int32(w) > np.int32(top[j]) else top[j]
        h[j] = (h[j] ^ w) * p
    for i in range(n_words * 4, n):  # bytes past the last whole word (plain fields only)
        if copy:
            dst[i] = src[i]
        h[0] = (h[0] ^ np.uint32(src[i])) * p
    acc = np.uint64(FNV64_BASIS)
    big = np.uint64(FNV64_PRIME)
    ok = True
    for j in range(LANES):
        acc = (acc ^ np.uint64(h[j])) * big
        if kind == 2:
            ok = ok and top[j] <= limit
        elif kind == 1:
            ok = ok and low[j] >= 0 and np.int32(top[j]) < limit
    acc = (acc ^ np.uint64(n)) * big
    return acc, ok


@njit(cache=True, boundscheck=False, nogil=True)
def _rows(fields, rows, used, kind, limit, hashes, ok):  # pragma: no cover
    """The pass over some rows of a batch where they lie: fields uint8 [batch rows, row
    bytes], rows int64 [n] (which), used int64 [n] (their used bytes); hashes uint64 [n]
    and ok bool [n] filled."""
    scratch = np.zeros(4, np.uint8)
    for i in range(rows.shape[0]):
        hashes[i], ok[i] = _pass(fields[rows[i], : used[i]], scratch, False, kind, limit)


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
_SCRATCH = np.zeros(4, np.uint8)  # the dst of a pass that copies nothing


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
        out = _SCRATCH if dst is None else _place(dst[k], src, name)
        h, ok = _pass(raw, out, dst is not None, kind, limit)
        hashes.append(h)
        bad |= not ok
    why = content_error(zip(names, used, strict=True), vocab_size) if bad else ""
    return fold(hashes), why


def _place(dst: np.ndarray, src: np.ndarray, name: str) -> np.ndarray:
    """The bytes of dst's first len(src) rows, which src's must fit exactly (the kernel
    checks no bounds)."""
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
        hashes.append(_pass(raw, _SCRATCH, False, PLAIN, 0)[0])
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
    _rows(flat, rows.astype(np.int64), used, kind, limit, hashes, ok)
    if kind == PLAIN and field.dtype.kind == "f":  # a float of another width: numpy's check
        for i, (r, n) in enumerate(zip(rows.tolist(), lengths.tolist(), strict=True)):
            ok[i] = not content_error([(name, field[r][:n])], vocab_size)
    return hashes, ok


def compile_kernels() -> None:
    """Compile (or load from numba's cache) every kernel for the types they meet, once per
    host: scripts/setup.sh, and a pool before it forks its producers."""
    for kind in (PLAIN, TOKENS, FLOAT32):
        a = np.zeros(70 * 4 + 3, np.uint8)
        frozen = a.copy()
        frozen.setflags(write=False)  # a cached array, a shared token cycle
        for src in (a, frozen):
            _pass(src, _SCRATCH, False, kind, 1)
            _pass(src, np.zeros_like(a), True, kind, 1)
        fields, which = np.zeros((2, 16), np.uint8), np.arange(2, dtype=np.int64)
        hashes, ok = np.empty(2, np.uint64), np.empty(2, bool)
        _rows(fields, which, np.full(2, 8, np.int64), kind, 1, hashes, ok)
