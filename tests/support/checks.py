"""What every real run in the tests must deliver: each row right, each item of the plan
exactly once."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

import numpy as np

from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.shared.config import Config
from tests.support.polling import wait_for

# Producers and the test process compute the same float features on different threads
# and, across hosts, on different CPUs (AVX2 or AVX-512): a log-mel value of the same clip
# may differ in its last bits (9.5e-7 seen between one and two BLAS threads). A wrong
# clip, a misplaced row or a torn copy differs by far more than this.
FEATURE_ATOL = 1e-4


def same_rows(got: np.ndarray, want: np.ndarray) -> bool:
    """got is want: equal shapes, integers equal, floats within FEATURE_ATOL (never
    compared bit for bit across processes: no code here promises that)."""
    if got.shape != want.shape:
        return False
    if np.issubdtype(want.dtype, np.floating):
        return bool(np.allclose(got, want, rtol=0, atol=FEATURE_ATOL))
    return bool(np.array_equal(got, want))


def consume(
    client: BatchClient,
    on_batch: Callable[[int], None] | None = None,
    timeout_s: float = 60,
    kept: list[dict] | None = None,
) -> list[int]:
    """Every valid item id of every batch until the plan ends; checks every row against
    its item (synthetic data). on_batch(n_items_so_far) runs after each batch; kept, if
    given, gets each batch's arrays (views into the ring, kept past their free)."""
    items: list[int] = []

    def plan_ended() -> bool:
        batch = client.next(timeout_s=timeout_s)
        if batch is None:
            return True
        items.extend(check_synthetic_rows(batch.arrays, batch.meta.n_valid, client.cfg))
        if kept is not None:
            kept.append(batch.arrays)
        client.free(batch)
        if on_batch is not None:
            on_batch(len(items))
        return False

    wait_for(plan_ended, timeout_s, "the end of the plan", interval_s=0)
    return items


def check_stager_rows(batch, cfg: Config) -> list[int]:
    """Every real row of a batch of synthetic items with stager mels (features.device:
    stager) against its item: its tokens, and its mel within gpu_mel.MEL_ATOL of its
    wave's on the CPU; -> the items, in row order."""
    from ringfeed.consumer.stager.gpu_mel import MEL_ATOL
    from ringfeed.consumer.stager.numpy_mel import NumpyLogMel
    from ringfeed.producer.sources import SyntheticSource

    source, cpu, a, items = SyntheticSource(cfg), NumpyLogMel(cfg), batch.arrays, []
    for row in range(batch.meta.n_valid):
        item = int(a["items"][row])
        sample = source.prepare(item)
        clip = sample.array("wave")
        wave = np.zeros((1, a["mel"].shape[1] * cfg.features.hop_length), np.float32)
        wave[0, : len(clip)] = clip
        mel, lens = cpu(wave, np.array([len(clip)]))
        t, f = int(a["text_lens"][row]), int(a["mel_lens"][row])
        assert np.array_equal(a["tokens"][row, :t], sample.tokens), (item, row)
        assert f == lens[0], (item, row)
        assert np.abs(a["mel"][row][:f] - mel[0][:f]).max() <= MEL_ATOL, (item, row)
        items.append(item)
    return items


def expected_rows(cfg: Config) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each item's tokens and mel as a producer makes them (no cache), by item id."""
    from ringfeed.producer.pipeline import SamplePipeline
    from ringfeed.producer.sample import SkipSample
    from ringfeed.shared.config import replace
    from ringfeed.shared.corpus.open import build_in_memory

    index = build_in_memory(cfg)
    pipe = SamplePipeline(replace(cfg, features={"cache": False}), index=index)
    out = {}
    for k in range(index.n_items):
        try:
            sample = pipe(index.entry(k), k)
        except SkipSample:  # a bad input: the run skips it too
            continue
        out[index.item_id(k)] = (sample.tokens, sample.mel)
    return out


def check_real_rows(batch, index, expected: dict) -> list[dict]:
    """Every real row of a batch of real audio against its item's tokens and mel
    (expected_rows); -> each row's fields, copied, with its item id as "item_id"."""
    a, rows = batch.arrays, []
    for row in range(batch.meta.n_valid):
        item_id = index.item_id(int(a["items"][row]))
        tokens, mel = expected[item_id]
        t, f = int(a["text_lens"][row]), int(a["mel_lens"][row])
        assert np.array_equal(a["tokens"][row, :t], tokens) and f == len(mel), item_id
        assert same_rows(a["mel"][row, :f], mel), item_id
        rows.append({"item_id": item_id} | {k: np.array(v[row]) for k, v in a.items()})
    return rows


def assert_exactly_once(items: list[int], cfg: Config, n_items: int) -> None:
    """The delivered multiset is the epoch's plan; deterministic mode also keeps its order."""
    plan = Plan(Shuffle(n_items, cfg.stager.seed), 1)
    expected = [plan.item_at(i) for i in range(n_items)]
    counts = collections.Counter(items)
    lost = sorted(set(expected) - set(counts))
    dup = sorted(i for i, c in counts.items() if c > 1)
    assert not lost and not dup, f"lost {lost[:20]}, duplicated {dup[:20]}"
    assert items == expected


def plan_items(cfg: Config, n_items: int, epochs: int = 1, skip: Iterable[int] = ()) -> list[int]:
    """What a run must deliver in deterministic mode: the plan's items in its order,
    less the skipped ones."""
    plan, skipped = Plan(Shuffle(n_items, cfg.stager.seed), epochs), set(skip)
    return [i for i in (plan.item_at(k) for k in range(n_items * epochs)) if i not in skipped]
