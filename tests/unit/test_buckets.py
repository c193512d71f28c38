"""Length buckets: the length table, the choice of shapes, the bucketed plan (real runs whose
every batch has its bucket's shape: tests/process/test_buckets.py)."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest

from ringfeed.consumer.stager.plan.buckets import (
    Bucket,
    BucketBatches,
    assign,
    least_padding,
    length_table,
    make_buckets,
)
from ringfeed.consumer.stager.plan.layout import KEPT_EPOCHS, kept_epochs
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.prepare.lengths import measure_lengths
from ringfeed.shared.config import ConfigError, config_from_dict
from ringfeed.shared.corpus.lengths import Lengths, lengths_key, load_lengths
from ringfeed.shared.corpus.open import open_corpus
from tests.support.paths import REPO

SHIPPED = REPO / "data" / "ljspeech-mini"


def padded_cost(lengths: list[int], values: np.ndarray, counts: np.ndarray) -> int:
    return sum(
        int(n) * (min(b for b in lengths if b >= v) - int(v))
        for v, n in zip(values, counts, strict=True)
    )


def test_auto_buckets_pad_least_of_all_choices() -> None:
    rng = np.random.default_rng(3)
    for _ in range(100):
        values = np.sort(rng.choice(np.arange(1, 80), size=rng.integers(1, 8), replace=False))
        counts = rng.integers(0, 10, size=len(values))
        for k in range(1, 5):
            got = least_padding(values, counts, k)
            assert got[-1] == values[-1] and len(got) <= k
            best = min(
                padded_cost([*c, int(values[-1])], values, counts)
                for r in range(min(k, len(values)))
                for c in itertools.combinations(values[:-1].tolist(), r)
            )
            assert padded_cost(got, values, counts) == best


def test_every_item_fits_its_bucket_and_every_batch_its_budget() -> None:
    cfg = config_from_dict(
        {"stager": {"auto_buckets": 4, "batch_size": 8}, "features": {"max_frames": 400}}
    )
    rng = np.random.default_rng(0)
    frames = rng.integers(20, 420, size=1000).astype(np.int32)
    frames[:5] = -1  # unreadable headers go to the largest bucket
    text = rng.integers(1, 200, size=1000).astype(np.int32)
    buckets, of_item = make_buckets(cfg, Lengths(frames, text))
    assert [b.frames for b in buckets] == sorted({b.frames for b in buckets})
    assert buckets[-1].frames == 400 and (of_item[:5] == len(buckets) - 1).all()
    for item, b in enumerate(of_item):
        if 0 < frames[item] <= 400:
            assert frames[item] <= buckets[b].frames
        assert text[item] <= buckets[b].text
    for b in buckets:
        assert b.rows * b.frames <= cfg.batch_frames  # no batch bigger than the fixed one


def test_the_bucketed_plan_is_pure_and_deals_every_item_once_per_epoch() -> None:
    cfg = config_from_dict(
        {"stager": {"buckets": [100, 200, 400]}, "features": {"max_frames": 400}}
    )
    rng = np.random.default_rng(1)
    frames = rng.integers(10, 400, size=777).astype(np.int32)
    text = rng.integers(1, 100, size=777).astype(np.int32)
    buckets, of_item = make_buckets(cfg, Lengths(frames, text))
    plan = Plan(BucketBatches(Shuffle(777, 42), buckets, of_item, text), epochs=3)
    again = Plan(BucketBatches(Shuffle(777, 42), buckets, of_item, text), epochs=3)
    for epoch in range(3):
        base = epoch * 777
        items = [plan.item_at(base + i) for i in range(777)]
        assert sorted(items) == list(range(777))
        assert items == [again.item_at(base + i) for i in range(777)]  # seed, epoch, length table
        position, partial = base, 0
        while position < base + 777:
            bucket, start, end = plan.batch_at(position)
            assert start == position and end > start and plan.batch_at(end - 1)[1] == start
            shape = buckets[bucket]
            assert end - start <= shape.rows
            partial += end - start < shape.rows
            for p in range(start, end):
                item = plan.item_at(p)
                assert frames[item] <= shape.frames and text[item] <= shape.text
            position = end
        assert partial <= len(buckets)  # leftovers share batches at the epoch's end
    assert [plan.item_at(i) for i in range(777)] != [plan.item_at(777 + i) for i in range(777)]


def test_measured_lengths_bound_what_producers_compute(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(SHIPPED, data)
    cfg = config_from_dict(
        {
            "data": {"path": str(data)},
            "features": {
                "cache_dir": str(tmp_path / "cache"),
                "cache": False,
                "on_too_long": "truncate",
                "max_frames": 2000,
            },
            "stager": {"auto_buckets": 2},
        }
    )
    index = open_corpus(cfg)
    table = measure_lengths(cfg, index)[0]
    pipeline = SamplePipeline(cfg)
    for item, entry in enumerate(index.entries):
        sample = pipeline(entry)
        assert len(sample.mel) <= table.frames[item] <= len(sample.mel) + 1, entry.item_id
        assert len(sample.tokens) == table.text[item]
    # Current as it is; a line appended to the metadata is measured, the others reused
    # (the lengths live in the corpus index, which is rebuilt and keeps them by id).
    assert not load_lengths(cfg, index)[1].any()
    shutil.copy(data / "wavs/LJ001-0003.wav", data / "wavs/NEW-0001.wav")
    with open(data / "metadata.csv", "a") as f:
        f.write("NEW-0001|A new line.|A new line.\n")
    index = open_corpus(cfg)
    current, stale = load_lengths(cfg, index)
    assert np.flatnonzero(stale).tolist() == [16] and current.frames[16] == -1
    again = measure_lengths(cfg, index)[0]
    assert (again.frames[:16] == table.frames).all() and again.frames[16] == table.frames[2]
    assert not load_lengths(cfg, open_corpus(cfg))[1].any()
    # Another setting that changes lengths is another key: every item measured again.
    other = config_from_dict(
        {**cfg.to_dict(), "features": {**cfg.to_dict()["features"], "hop_length": 512}}
    )
    assert lengths_key(other) != lengths_key(cfg)
    assert load_lengths(other, open_corpus(other))[1].all()


@pytest.mark.parametrize("frames", [[40], [10, 20, 40]])
def test_assign_puts_each_length_in_the_shortest_bucket_that_fits(frames: list[int]) -> None:
    lengths = np.array([-1, 0, 1, 10, 11, 20, 39, 40, 41], np.int32)
    got = assign(lengths, frames)
    for length, b in zip(lengths, got, strict=True):
        if 0 < length <= frames[-1]:
            assert frames[b] >= length and (b == 0 or frames[b - 1] < length)
        else:
            assert b == len(frames) - 1


def test_a_large_corpus_keeps_two_epochs_of_int32_order_a_small_one_five() -> None:
    assert kept_epochs(Shuffle(10_000_000, 0)) == 2  # 8 bytes a clip of order
    assert kept_epochs(Shuffle(1000, 0)) == KEPT_EPOCHS
    rng = np.random.default_rng(0)
    of_item = rng.integers(0, 3, 5000).astype(np.int32)
    buckets = [Bucket(200, 40, 8), Bucket(400, 80, 4), Bucket(800, 160, 2)]
    layout = BucketBatches(Shuffle(5000, 0), buckets, of_item).layout(0)
    assert layout.order.dtype == np.int32
    assert sorted(layout.order.tolist()) == list(range(5000))


def test_the_stager_reads_the_length_table_and_never_measures_it(tmp_path: Path) -> None:
    """No process of a run prepares the corpus: the stager's length table is what
    preparation measured, and a table it lacks is a config error naming what to run
    (it once started `ringfeed lengths` in a subprocess, round the rule that consumer
    code never runs producer code)."""
    cfg = config_from_dict(
        {
            "data": {"path": str(SHIPPED)},
            "features": {"cache_dir": str(tmp_path / "cache"), "on_too_long": "truncate"},
            "stager": {"auto_buckets": 2},
        }
    )
    index = open_corpus(cfg)
    with pytest.raises(
        ConfigError,
        match=r"^stager.buckets: the length table of .* lacks 16 "
        r"of 16 items .*: run `ringfeed prepare CONFIG` first",
    ):
        length_table(cfg, index)
    measured = measure_lengths(cfg, index)[0]
    table = length_table(cfg, index)
    assert (table.frames == measured.frames).all() and (table.text == measured.text).all()
