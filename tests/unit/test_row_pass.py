"""One pass over a sample's rows (shared/memory/row_pass.py): the value check is
shared/sample/content.py's rule at every edge, the checksum sees every changed word,
the copy is the rows, and a batch's rows checked where they lie hash as the sample
written alone did."""

from __future__ import annotations

import numpy as np
import pytest

from ringfeed.shared.memory.row_pass import check_fields, check_rows, fold, rows_checksum
from ringfeed.shared.sample.content import MAX_ABS, content_error

VOCAB = 100
EDGES = [
    0.0,
    -0.0,
    1e-45,  # a subnormal
    MAX_ABS,
    -MAX_ABS,
    np.nextafter(np.float32(MAX_ABS), np.float32(np.inf)),
    np.nan,
    np.inf,
    -np.inf,
    -np.nan,
]


@pytest.mark.parametrize("edge", EDGES)
@pytest.mark.parametrize("at", [0, 77, 6399])  # a first block, a lane, the last word
def test_a_float_rows_check_is_content_errors_rule(edge: float, at: int) -> None:
    mel = np.random.default_rng(0).standard_normal((80, 80)).astype(np.float32)
    mel.reshape(-1)[at] = edge
    _, why = check_fields(["mel"], [mel], VOCAB)
    assert bool(why) == bool(content_error({"mel": mel}, VOCAB)), (edge, why)
    assert why == content_error({"mel": mel}, VOCAB)


@pytest.mark.parametrize("token", [0, VOCAB - 1, VOCAB, -1, 2**31 - 1, -(2**31)])
def test_a_token_rows_check_is_content_errors_rule(token: int) -> None:
    tokens = np.arange(3, 3 + 67, dtype=np.int32) % VOCAB
    tokens[41] = token
    _, why = check_fields(["tokens"], [tokens], VOCAB)
    assert why == content_error({"tokens": tokens}, VOCAB), token


def test_a_float_of_another_width_and_a_plain_field_are_checked_as_content_error_says() -> None:
    pitch = np.array([1.0, np.nan, 3.0], np.float64)  # a user's field: numpy's check
    voiced = np.array([1, 0, 1, 1, 0], np.uint8)  # not bounded
    _, why = check_fields(["pitch", "voiced"], [pitch, voiced], VOCAB)
    assert why == content_error({"pitch": pitch, "voiced": voiced}, VOCAB) != ""
    assert check_fields(["voiced"], [voiced], VOCAB)[1] == ""


def test_every_changed_word_or_byte_changes_the_checksum() -> None:
    """Each lane's FNV-1a is a bijection of the lane for each word: one change, anywhere
    (a whole block, the words past the last block, the bytes past the last word), is
    always seen."""
    raw = np.random.default_rng(1).integers(0, 256, 64 * 4 * 3 + 4 * 5 + 3, dtype=np.uint8)
    base = rows_checksum([raw])
    for i in range(len(raw)):
        changed = raw.copy()
        changed[i] ^= 1 << (i % 8)
        assert rows_checksum([changed]) != base, i
    assert rows_checksum([raw[:-1]]) != base  # the length is folded in too


def test_the_copy_is_the_rows_and_hashes_as_the_rows() -> None:
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, VOCAB, 37).astype(np.int32)
    mel = rng.standard_normal((23, 80)).astype(np.float32)
    dst = [np.full(64, -7, np.int32), np.full((32, 80), -7, np.float32)]
    checksum, why = check_fields(["tokens", "mel"], [tokens, mel], VOCAB, dst)
    assert why == "" and checksum == check_fields(["tokens", "mel"], [tokens, mel], VOCAB)[0]
    assert checksum == rows_checksum([tokens, mel])
    assert (dst[0][:37] == tokens).all() and (dst[0][37:] == -7).all()
    assert (dst[1][:23] == mel).all() and (dst[1][23:] == -7).all()


def test_rows_that_do_not_fit_their_place_are_refused_before_any_byte_is_written() -> None:
    dst = [np.zeros((8, 80), np.float32)]
    for rows in (np.zeros((9, 80), np.float32), np.zeros((4, 81), np.float32)):
        with pytest.raises(ValueError, match="do not fit a place"):
            check_fields(["mel"], [rows], VOCAB, dst)
    assert not dst[0].any()


def test_a_batchs_rows_checked_where_they_lie_hash_as_each_sample_alone() -> None:
    rng = np.random.default_rng(3)
    batch = rng.standard_normal((6, 40, 8)).astype(np.float32)
    lengths = np.array([40, 1, 17, 0, 33, 5])
    batch[4, 30, 2] = np.inf
    batch[4, 34, 2] = np.nan  # past its length: not its row
    rows = np.array([0, 1, 2, 3, 4, 5])
    hashes, ok = check_rows(batch, rows, lengths, "mel", VOCAB)
    for r, n in enumerate(lengths):
        alone, why = check_fields(["mel"], [batch[r][:n]], VOCAB)
        assert fold([hashes[r]]) == alone and ok[r] == (why == ""), r
    assert ok.tolist() == [True, True, True, True, False, True]


M32, M64 = (1 << 32) - 1, (1 << 64) - 1


def reference_hash(raw: np.ndarray) -> int:
    """Protocol 8's hash of a field's bytes, as plainly as it can be written: 64 lanes of
    32-bit FNV-1a, word i into lane i % 64, the bytes past the last word into lane 0,
    then the lanes and the byte count folded by 64-bit FNV-1a."""
    n = len(raw)
    lanes = [(2166136261 + j) & M32 for j in range(64)]
    for i, word in enumerate(raw[: n // 4 * 4].view(np.uint32).tolist()):
        lanes[i % 64] = ((lanes[i % 64] ^ word) * 16777619) & M32
    for byte in raw[n // 4 * 4 :].tolist():
        lanes[0] = ((lanes[0] ^ byte) * 16777619) & M32
    acc = 14695981039346656037
    for x in [*lanes, n]:
        acc = ((acc ^ x) * 1099511628211) & M64
    return acc


# The field hashes the numba kernel of protocol 8 gave (main 70274f7, before the pass was
# C) for the bytes below: a peer of the same protocol built before agrees bit for bit.
SIZES = [0, 1, 3, 4, 7, 255, 256, 257, 64 * 4 * 3 + 23, 4096, 256800]
PROTOCOL_8 = [
    8212598900928356639,
    1237893247507029455,
    11232843530273926948,
    14313006168579615043,
    16585800321373257662,
    11626894214249590104,
    15723671516746685518,
    8283446699044829767,
    8622113038136575675,
    6849032406093556519,
    2690678504958735501,
]


def test_the_checksum_is_protocol_8s_bit_for_bit() -> None:
    rng = np.random.default_rng(20261129)
    for n, expected in zip(SIZES, PROTOCOL_8, strict=True):
        raw = rng.integers(0, 256, n, dtype=np.uint8)
        assert reference_hash(raw) == expected, n
        assert rows_checksum([raw]) == fold([expected]), n
        if n % 4 == 0:  # every kind hashes alike, copying or not
            floats, tokens = raw.view(np.float32), raw.view(np.int32)
            assert check_fields(["mel"], [floats], VOCAB)[0] == fold([expected])
            assert check_fields(["tokens"], [tokens], VOCAB)[0] == fold([expected])
            dst = [np.zeros(n // 4 + 3, np.int32)]
            assert check_fields(["tokens"], [tokens], VOCAB, dst)[0] == fold([expected])


def test_a_pass_refuses_what_lies_outside_its_buffers() -> None:
    """The C pass checks its own bounds: a place too small, a row outside the batch, an
    unknown kind are errors, never a read or write past the memory."""
    from ringfeed.shared.memory import _row_pass

    src = np.arange(40, dtype=np.uint8)
    with pytest.raises(ValueError, match="do not fit a place of 39"):
        _row_pass.field(src, np.zeros(39, np.uint8), 0, 0)
    with pytest.raises(ValueError, match="kind 7"):
        _row_pass.field(src, None, 7, 0)
    frozen = np.zeros(40, np.uint8)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        _row_pass.field(src, frozen, 0, 0)
    fields = np.zeros((4, 16), np.uint8)
    hashes, ok = np.empty(1, np.uint64), np.empty(1, np.bool_)
    for row, used in ((4, 8), (-1, 8), (0, 17), (0, -1), (2**63 - 1, 16), (2**62, 16)):
        with pytest.raises(ValueError, match="outside 4 rows of 16 bytes"):
            _row_pass.rows(fields, 16, np.array([row]), np.array([used]), 0, 0, hashes, ok)
    with pytest.raises(ValueError, match="one each per row"):
        _row_pass.rows(fields, 16, np.array([0, 1]), np.array([8]), 0, 0, hashes, ok)
    with pytest.raises(TypeError, match="rows must be int64"):  # never read as int64
        _row_pass.rows(fields, 16, np.array([1, 0], np.int32), np.array([8]), 0, 0, hashes, ok)
    with pytest.raises(TypeError, match="hashes must be uint64"):
        _row_pass.rows(fields, 16, np.array([1]), np.array([8]), 0, 0, np.empty(1), ok)
    # The hashes written over the row numbers still to come: each row is read once, checked
    # and used, so the overwritten one is refused, never read outside the rows.
    shared = np.zeros(3, np.int64)
    shared[:2] = [0, 1]
    with pytest.raises(ValueError, match="outside 4 rows"):
        _row_pass.rows(
            fields,
            16,
            shared[:2],
            np.array([8, 8]),
            0,
            0,
            shared[1:].view(np.uint64),
            np.empty(2, np.bool_),
        )
