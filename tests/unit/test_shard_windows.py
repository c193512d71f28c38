"""Shard windows with everything on (consumer/stager/plan/shard_window.py WindowedBatches),
without processes, on the generated lopsided corpus cut into 24 shards: with length
buckets every item once an epoch and each batch within one window; balanced within each
window (quotas of the window's groups, no clip again before its group came once there);
and shared by two training workers, a resume on one continuing the global batches (an
end-to-end run on tar shards: tests/process/test_tar_shards.py)."""

from __future__ import annotations

import numpy as np
import pytest

from ringfeed.consumer.stager.plan.balance import Groups, group_weights
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shard_window import ShardWindows, WindowedBatches
from ringfeed.shared.run.share import Share
from tests.support.lopsided import early_repeats, lopsided_corpus
from tests.support.plan_walk import batches

N_ITEMS, SHARDS, WINDOW, SEED = 2400, 24, 4, 5
CORPUS = lopsided_corpus(N_ITEMS, seed=2)
STARTS = np.linspace(0, N_ITEMS, SHARDS + 1).astype(np.int64)
SHARD_OF = np.searchsorted(STARTS, np.arange(N_ITEMS), "right") - 1


def windowed(temperature: float | None) -> WindowedBatches:
    balanced = None if temperature is None else (CORPUS.languages, temperature, [1.0] * 3)
    return WindowedBatches(
        ShardWindows(SEED, STARTS, WINDOW), CORPUS.buckets, CORPUS.of_bucket, CORPUS.text, balanced
    )


def window_batches(layout) -> list[np.ndarray]:
    """Each batch's items."""
    ends = np.append(layout.starts, len(layout.order))
    return [layout.order[s:e] for s, e in zip(ends[:-1], ends[1:], strict=True)]


def test_bucketed_windows_deal_every_item_once_and_no_batch_spans_two_windows() -> None:
    part = windowed(None)
    for epoch in range(3):
        layout = part.layout(epoch)
        assert sorted(layout.order.tolist()) == list(range(N_ITEMS)), "each item once an epoch"
        window_of = np.empty(SHARDS, np.int64)  # the window each shard is in, this epoch
        for w, items in enumerate(part.windows.windows(epoch)):
            window_of[np.unique(SHARD_OF[items])] = w
        seen = []
        for batch in window_batches(layout):
            assert len(set(window_of[SHARD_OF[batch]].tolist())) == 1, "one window a batch"
            seen.append(int(window_of[SHARD_OF[batch[0]]]))
        assert seen == sorted(seen), "window after window: a shard is needed in one only"
        rows = np.array([b.rows for b in CORPUS.buckets])
        assert (
            CORPUS.of_bucket[layout.order]
            <= np.repeat(layout.buckets, np.diff(np.append(layout.starts, N_ITEMS)))
        ).all()
        assert (np.diff(np.append(layout.starts, N_ITEMS)) <= rows[layout.buckets]).all()


@pytest.mark.parametrize("temperature", [0.0, 0.3, 1.0])
def test_balanced_windows_keep_each_windows_quotas_and_no_early_repeat(temperature) -> None:
    part = windowed(temperature)
    layout = part.layout(1)
    at = 0
    for items in part.windows.windows(1):
        mine = layout.order[at : at + len(items)]
        at += len(items)
        local = Groups(CORPUS.languages.of_item[items], CORPUS.languages.names)
        weights = group_weights(local.sizes, temperature, [1.0] * 3)
        drawn = np.bincount(CORPUS.languages.of_item[mine], minlength=3)
        assert set(mine.tolist()) <= set(items.tolist()), "only the window's own clips"
        assert drawn.sum() == len(items)
        assert np.abs(drawn - len(items) * weights / weights.sum()).max() < 1  # its quotas
        assert early_repeats(mine, CORPUS.languages, local.sizes) == 0
    assert at == N_ITEMS


@pytest.mark.parametrize("temperature", [None, 0.3])
def test_two_workers_share_the_windows_and_one_continues_their_global_batches(temperature):
    whole = Plan(windowed(temperature), epochs=2)
    steps = [batches(whole.with_share(Share(k, 2))) for k in range(2)]
    global_two = [sorted(p for _, ps in step for p in ps) for step in zip(*steps, strict=True)]
    trained = [p for b in global_two for p in b]
    assert len(trained) == len(set(trained)), "the workers' shares are disjoint"
    cut = len(global_two) // 3
    cursor = whole.batch_at(global_two[cut - 1][0])[2]  # the chief's checkpoint
    resumed = [ps for _, ps in batches(whole, cursor)]
    done = {p for b in global_two[:cut] for p in b}
    assert not done & {p for b in resumed for p in b}, "nothing again after the resume"
