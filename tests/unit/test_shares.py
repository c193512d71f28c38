"""Several training workers: each stager serves its share of one global plan.

The plan side without processes (consumer/stager/plan/, Plan with a Share): disjoint
shares whose union is each epoch less its stated remainder, one batch per
global batch on every worker, the same bucket at every step, and a resume from
the chief's cursor that gives every worker the batches of an uninterrupted run.
"""

from __future__ import annotations

import numpy as np
import pytest

from ringfeed.consumer.stager.plan.buckets import Bucket, BucketBatches
from ringfeed.consumer.stager.plan.make import make_plan
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.shared.config import config_from_dict
from ringfeed.shared.config.loader import ConfigError
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.share import Share
from tests.support.plan_walk import batches

N_ITEMS = 157


def bucketed_plan(buckets, of_item, epochs: int, text=None) -> Plan:
    """One worker's plan of batches dealt from seed 7's Shuffle, as the stager's."""
    return Plan(BucketBatches(Shuffle(len(of_item), 7), buckets, of_item, text), epochs)


def global_plan(bucketed: bool, epochs: int = 3) -> Plan:
    if not bucketed:  # buckets off: one bucket of the fixed shape
        return bucketed_plan([Bucket(800, 200, 8)], np.zeros(N_ITEMS, np.int32), epochs)
    rng = np.random.default_rng(1)
    buckets = [Bucket(200, 64, 12), Bucket(400, 96, 6), Bucket(800, 200, 3)]
    return bucketed_plan(buckets, rng.integers(0, 3, N_ITEMS).astype(np.int32), epochs)


@pytest.mark.parametrize("bucketed", [False, True])
@pytest.mark.parametrize("n_workers", [2, 3])
def test_shares_are_disjoint_and_cover_each_epoch_in_lockstep(
    bucketed: bool, n_workers: int
) -> None:
    whole = global_plan(bucketed)
    shares = [whole.with_share(Share(k, n_workers)) for k in range(n_workers)]
    runs = [batches(s) for s in shares]
    assert len({len(r) for r in runs}) == 1, "every worker takes one batch per global batch"
    for step in zip(*runs, strict=True):
        assert len({bucket for bucket, _ in step}) == 1, "one bucket per step everywhere"
        bucket, first = step[0]
        _, start, end = whole.batch_at(first[0])
        assert sorted(p for _, ps in step for p in ps) == list(range(start, end))
        for _, positions in step:  # static shapes: no worker's part outgrows its rows
            assert 1 <= len(positions) <= Share(0, n_workers).rows(whole.buckets[bucket].rows)
    for epoch in range(3):
        seen = [
            whole.item_at(p) for r in runs for _, ps in r for p in ps if whole.epoch_of(p) == epoch
        ]
        assert len(seen) == len(set(seen)) == N_ITEMS - shares[0].remainder(epoch)
    assert all(s.remainder(0) < n_workers * len(whole.buckets) for s in shares)


@pytest.mark.parametrize("bucketed", [False, True])
def test_every_worker_resumes_from_the_chiefs_cursor(bucketed: bool) -> None:
    whole = global_plan(bucketed)
    shares = [whole.with_share(Share(k, 2)) for k in range(2)]
    uninterrupted = [batches(s) for s in shares]
    for cut in (1, 5, len(uninterrupted[0]) // 2, len(uninterrupted[0]) - 1):
        # The chief's cursor after batch `cut`: its next position (a BATCH_READY's).
        chief_cursor = uninterrupted[0][cut][1][0]
        for share, whole_run in zip(shares, uninterrupted, strict=True):
            assert batches(share, chief_cursor) == whole_run[cut:]


def test_one_worker_owns_every_position_and_a_bad_share_is_refused() -> None:
    whole = global_plan(True)
    assert batches(whole.with_share(Share(0, 1))) == batches(whole)
    assert Share.parse("1/4") == Share(1, 4)
    for text in ("4/4", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ConfigError, match="--worker"):
            Share.parse(text)


def test_each_worker_builds_its_rows_of_every_global_batch() -> None:
    whole = global_plan(True)  # rows 12, 6 and 3
    for k in range(3):
        mine = whole.with_share(Share(k, 3))
        assert mine.lockstep and [b.rows for b in mine.buckets] == [4, 2, 1]
        for position in (0, 50, 200):
            assert mine.bucket_at(position) == mine.buckets[whole.batch_at(position)[0]]
    assert whole.batched and not whole.lockstep and not Plan(Shuffle(N_ITEMS, 7)).batched
    with pytest.raises(ValueError, match="needs batches"):  # make_plan never asks for it
        Plan(Shuffle(N_ITEMS, 7), share=Share(0, 2))


def test_a_global_batch_too_small_for_every_worker_is_a_config_error(tmp_path) -> None:
    cfg = config_from_dict(
        {"data": {"format": "synthetic", "synthetic_items": 20}, "stager": {"batch_size": 2}}
    )
    index = open_corpus(cfg)
    plan = make_plan(cfg, index, Share(1, 2))
    assert plan.lockstep and plan.batched and [b.rows for b in plan.buckets] == [1]
    with pytest.raises(ConfigError, match="stager.batch_size"):
        make_plan(cfg, index, Share(0, 3))
    unordered = config_from_dict(cfg.to_dict() | {"stager": {"deterministic": False}})
    with pytest.raises(ConfigError, match="stager.deterministic"):
        make_plan(unordered, index, Share(0, 2))


def test_the_plan_fingerprint_is_the_same_for_any_number_of_workers(tmp_path) -> None:
    """A checkpoint of a run on 2 workers resumes on 1 or 3 (and back): its plan, and so
    its fingerprint, does not depend on how many workers share it."""
    for stager in ({}, {"balance": {"by": "language"}}):
        cfg = config_from_dict(
            {
                "data": {"format": "synthetic", "synthetic_items": 60},
                "stager": {"batch_size": 6, **stager},
            }
        )
        index = open_corpus(cfg)
        prints = [make_plan(cfg, index, Share(0, n)).fingerprint for n in (1, 2, 3)]
        assert prints[0] == prints[1] == prints[2], stager


def test_a_dataset_with_no_batch_for_every_worker_is_refused() -> None:
    # Three items, each alone in a batch (no text fits a longer bucket's): no global
    # batch has 2 items.
    buckets = [Bucket(200, 64, 4), Bucket(400, 50, 4), Bucket(800, 40, 4)]
    whole = bucketed_plan(buckets, np.arange(3, dtype=np.int32), 0, np.array([60, 45, 40]))
    with pytest.raises(ConfigError, match="use fewer workers"):
        whole.with_share(Share(0, 2)).next_owned(0)
