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
