"""Balanced epochs (consumer/stager/plan/balance.py) on a generated lopsided corpus, without
processes: exact quotas, at most once per repeat and no clip again before its group's
pass is out in delivery order, the ratios in every window of 10 batches, determinism,
batches of one bucket (but for clips riding in a longer one), and a resume under another number of
training workers that continues the same global batches; then the stager's plan,
its fingerprint and validate's lines (a real run: tests/process/test_balance.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ringfeed.consumer.stager.plan.balance import (
    BalancedBatches,
    Groups,
    balanced_layout,
    drawn,
    group_weights,
    quotas,
)
from ringfeed.consumer.stager.plan.buckets import (
    Bucket,
    BucketBatches,
    assign,
    bucket_lengths,
    make_buckets,
)
from ringfeed.consumer.stager.plan.group_walk import arrivals
from ringfeed.consumer.stager.plan.make import make_plan
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.consumer.stager.plan.skips import header_skips, known_skips
from ringfeed.producer.prepare.prepare import prepare
from ringfeed.scripts.corpus_report import corpus_check
from ringfeed.shared.config import config_from_dict
from ringfeed.shared.config.loader import ConfigError
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.fingerprint import PLAN_PARTS, plan_changes
from ringfeed.shared.run.share import Share
from tests.support.corpora import write_manifest
from tests.support.lopsided import early_repeats, lopsided_corpus
from tests.support.paths import WAVS
from tests.support.plan_walk import batches

N_ITEMS = 6000
SEED = 11
WINDOW_BATCHES = 10
# The largest gap between a group's share of any 10 consecutive batches and its target
# share, on this corpus (docs/plans.md#balanced-epochs): one bucket per batch, and the rare
# language speaks longer clips, so a window's mix of buckets moves its share of them; and
# at a pass boundary of a group a few of its clips ride in a longer bucket's batch.
WINDOW_BOUND = {"bucketed": 0.1, "fixed": 0.03}
# Balanced padding efficiency below the plain bucketed plan's, at most, with auto buckets
# fitted to the epoch as drawn: none on this corpus (0.828 of the frames real at
# temperature 0, 0.823 at 0.3, against 0.818), as the riders cost 0.010 and 0.009 and the
# epoch's own lengths gain more (docs/plans.md#balanced-epochs); 0.021 and 0.012 before
# a turn picked its clip as it was dealt (issue 49).
PADDING_GAP = 0.005
# Clips in a longer bucket's batch than their own, at most, of the epoch (pass_deal.py rules
# 1 and 2): 3.1 % by speaker at temperature 0 (5.9 % before issue 49).
RIDERS_BOUND = 0.04

CORPUS = lopsided_corpus(N_ITEMS)
FIXED = [Bucket(800, 200, 32)]


def layout_of(groups: Groups, temperature: float, bucketed: bool, epoch: int = 0, seed=SEED):
    weights = group_weights(groups.sizes, temperature, [1.0] * len(groups.names))
    of_bucket = CORPUS.of_bucket if bucketed else np.zeros(N_ITEMS, np.int32)
    buckets = CORPUS.buckets if bucketed else FIXED
    layout = balanced_layout(groups, weights, of_bucket, buckets, CORPUS.text, seed, epoch)
    return layout, quotas(weights, N_ITEMS, seed, epoch)


GROUPINGS = {"language": CORPUS.languages, "speaker": CORPUS.speakers}


@pytest.mark.parametrize("by", GROUPINGS)
@pytest.mark.parametrize("temperature", [0.0, 0.3, 1.0])
def test_each_group_gets_exactly_its_quota_each_item_at_most_once_per_repeat(
    by: str, temperature: float
) -> None:
    groups = GROUPINGS[by]
    for epoch in range(3):
        layout, quota = layout_of(groups, temperature, bucketed=True, epoch=epoch)
        assert len(layout.order) == quota.sum() == N_ITEMS
        assert np.array_equal(
            np.bincount(groups.of_item[layout.order], minlength=len(quota)), quota
        )
        times = np.bincount(layout.order, minlength=N_ITEMS)
        for g, (q, n) in enumerate(zip(quota, groups.sizes, strict=True)):
            mine = times[groups.of_item == g]
            repeats, more = divmod(int(q), int(n))
            assert set(mine.tolist()) <= {repeats, repeats + 1}, "at most once per repeat"
            assert int((mine == repeats + 1).sum()) == more
    sizes = groups.sizes
    if temperature == 1.0:  # as in the data: every clip once, exactly
        assert np.array_equal(quota, sizes)
    if temperature == 0.0:  # uniform: the same share for every group, to one position
        assert quota.max() - quota.min() <= 1


def test_quotas_follow_the_temperature_and_average_the_exact_share() -> None:
    sizes = CORPUS.languages.sizes
    shares = [
        quotas(group_weights(sizes, t, [1, 1, 1]), N_ITEMS, SEED, 0) / N_ITEMS
        for t in (1.0, 0.3, 0.0)
    ]
    assert shares[0][2] < shares[1][2] < shares[2][2], "the rare language gains as t falls"
    weights = group_weights(sizes, 0.3, [1, 2, 1])  # a multiplier doubles language b
    exact = N_ITEMS * weights / weights.sum()
    drawn = np.array([quotas(weights, N_ITEMS, SEED, e) for e in range(400)])
    assert (drawn.sum(axis=1) == N_ITEMS).all()
    assert np.all(np.abs(drawn - exact) < 1)  # floor or ceiling of the exact share
    assert np.abs(drawn.mean(axis=0) - exact).max() < 0.15  # its mean, over epochs


@pytest.mark.parametrize("by", GROUPINGS)
@pytest.mark.parametrize("temperature", [0.0, 0.3, 1.0])
def test_in_delivery_order_no_clip_comes_again_before_its_group_came_once(by, temperature):
    groups = GROUPINGS[by]
    for epoch in range(3):
        layout, _ = layout_of(groups, temperature, bucketed=True, epoch=epoch)
        assert early_repeats(layout.order, groups) == 0, f"epoch {epoch}"


def test_the_stagers_delivery_order_has_no_early_repeat_either() -> None:
    groups = CORPUS.languages
    weights = group_weights(groups.sizes, 0.0, [1.0] * len(groups.names))
    part = BalancedBatches(SEED, CORPUS.buckets, CORPUS.of_bucket, groups, weights, CORPUS.text)
    delivered = [p for _, positions in batches(Plan(part, epochs=2)) for p in positions]
    plan = Plan(part, epochs=2)
    assert delivered == list(range(2 * N_ITEMS))  # deterministic: the plan's own order
    for epoch in range(2):
        order = np.array([plan.item_at(p) for p in range(epoch * N_ITEMS, (epoch + 1) * N_ITEMS)])
        assert early_repeats(order, groups) == 0


@pytest.mark.parametrize("bucketed", [True, False], ids=["bucketed", "fixed"])
@pytest.mark.parametrize("temperature", [0.0, 0.3, 1.0])
def test_every_window_of_ten_batches_keeps_the_target_ratio(bucketed, temperature) -> None:
    groups = CORPUS.languages
    for epoch in range(3):
        layout, quota = layout_of(groups, temperature, bucketed, epoch=epoch)
        target = quota / quota.sum()
        group = groups.of_item[layout.order]
        ends = np.append(layout.starts, len(layout.order))
        full = len(layout.starts) - len(CORPUS.buckets)  # the epoch's last, part-filled ones
        worst = 0.0
        for i in range(full - WINDOW_BATCHES):
            window = np.bincount(group[ends[i] : ends[i + WINDOW_BATCHES]], minlength=3)
            worst = max(worst, np.abs(window / window.sum() - target).max())
        assert worst <= WINDOW_BOUND["bucketed" if bucketed else "fixed"], f"epoch {epoch}"


@pytest.mark.parametrize("temperature", [0.0, 0.3])
def test_batches_hold_one_bucket_full_but_for_riders_and_the_last_few(temperature) -> None:
    layout, _ = layout_of(CORPUS.speakers, temperature, bucketed=True)
    sizes = np.diff(np.append(layout.starts, len(layout.order)))
    rows = np.array([b.rows for b in CORPUS.buckets])
    full = sizes == rows[layout.buckets]
    assert int((~full).sum()) <= 2, "a few part-filled batches, at the epoch's end"
    assert full[: int(full.sum())].all()
    of_batch = np.repeat(layout.buckets, sizes)
    own = CORPUS.of_bucket[layout.order]
    assert (own <= of_batch).all(), "a clip rides only in a longer bucket's batch"
    assert (CORPUS.text[layout.order] <= np.array([b.text for b in CORPUS.buckets])[of_batch]).all()
    assert (own < of_batch).mean() <= RIDERS_BOUND


def test_one_seed_gives_one_plan_and_epochs_differ() -> None:
    first, _ = layout_of(CORPUS.speakers, 0.3, bucketed=True, epoch=2)
    again, _ = layout_of(CORPUS.speakers, 0.3, bucketed=True, epoch=2)
    for field in ("order", "starts", "buckets"):
        assert np.array_equal(getattr(first, field), getattr(again, field))
    other, _ = layout_of(CORPUS.speakers, 0.3, bucketed=True, epoch=3)
    reseeded, _ = layout_of(CORPUS.speakers, 0.3, bucketed=True, epoch=2, seed=SEED + 1)
    assert not np.array_equal(first.order, other.order)
    assert not np.array_equal(first.order, reseeded.order)


def test_due_order_keeps_every_prefix_near_each_groups_share() -> None:
    runs = np.array([700, 90, 9, 1])
    starts = np.concatenate([[0], np.cumsum(runs)]).astype(np.int64)
    run_of = arrivals(starts, runs, int(runs.sum()))[0]
    counts = np.cumsum(np.eye(len(runs), dtype=np.int64)[run_of], axis=0)
    share = runs / runs.sum()
    expected = np.outer(np.arange(1, runs.sum() + 1), share)
    # half an item of its due time, plus the others' roundings (group_walk.arrivals)
    assert (np.abs(counts - expected) < 0.5 + share * len(runs) / 2).all()
    assert np.abs(counts - expected).max() <= 1.25


def global_batches(whole, n_workers: int, start: int = 0) -> list[list[int]]:
    """The global batches (sorted positions) that n_workers train from plan position
    `start`: at each step, the union of every worker's batch."""
    runs = [batches(whole.with_share(Share(k, n_workers)), start) for k in range(n_workers)]
    return [sorted(p for _, ps in step for p in ps) for step in zip(*runs, strict=True)]


@pytest.mark.parametrize("before, after", [(2, 3), (3, 1), (1, 2)])
def test_a_resume_with_another_number_of_workers_continues_the_global_batches(
    before: int, after: int
) -> None:
    n = 900
    corpus = lopsided_corpus(n, seed=3)
    weights = group_weights(corpus.speakers.sizes, 0.0, [1.0] * len(corpus.speakers.names))
    buckets = [Bucket(b.frames, b.text, max(3, b.rows // 16)) for b in corpus.buckets]
    part = BalancedBatches(SEED, buckets, corpus.of_bucket, corpus.speakers, weights, corpus.text)
    whole = Plan(part, epochs=2)
    old, new = global_batches(whole, before), global_batches(whole, after)
    for cut in (1, len(old) // 3, len(old) // 2 + 1):
        cursor = whole.batch_at(old[cut - 1][0])[2]  # the chief's checkpoint: a global end
        resumed = global_batches(whole, after, cursor)
        assert resumed == [b for b in new if b[0] >= cursor]
        trained = [p for b in old[:cut] + resumed for p in b]
        assert len(trained) == len(set(trained)), "nothing repeated"
        whole_batches = {
            tuple(range(s, e)) for s, e in all_batches(whole) if e - s >= max(before, after)
        }
        assert whole_batches <= {tuple(b) for b in old[:cut] + resumed}, "nothing skipped"


def all_batches(plan) -> list[tuple[int, int]]:
    out, position = [], 0
    while position < plan.end:
        _, start, end = plan.batch_at(position)
        out.append((start, end))
        position = end
    return out


def manifest_config(tmp_path, **balance):
    """A jsonl corpus of the shipped clips: speaker ann 9 clips, bob 2, cy 1."""
    speakers = ["ann"] * 9 + ["bob"] * 2 + ["cy"]
    lines = [
        {
            "audio": str(WAVS / f"LJ001-{k + 1:04d}.wav"),
            "text": f"clip {k}",
            "speaker": s,
            "id": f"c{k}",
        }
        for k, s in enumerate(speakers)
    ]
    path = write_manifest(tmp_path / "m.jsonl", lines)
    stager = {"batch_size": 4} | ({"balance": balance} if balance else {})
    return config_from_dict({"data": {"path": str(path), "format": "jsonl"}, "stager": stager})


def test_the_stager_plan_balances_and_its_fingerprint_names_the_balance(tmp_path) -> None:
    plain = manifest_config(tmp_path)
    index = open_corpus(plain)
    base_plan = make_plan(plain, index)
    base = base_plan.fingerprint
    assert type(base_plan.source) is Shuffle and "balance" not in base  # the default: as before
    cfg = manifest_config(tmp_path, by="speaker", temperature=0.0)
    plan = make_plan(cfg, index)
    ours = plan.fingerprint
    assert isinstance(plan.source, BalancedBatches) and [b.rows for b in plan.buckets] == [4]
    assert plan.source.quotas(0).tolist() == [4, 4, 4]  # ann, bob, cy: uniform
    epoch = [index.item_id(plan.item_at(p)) for p in range(12)]
    assert sorted(epoch.count(f"c{k}") for k in (9, 10, 11)) == [2, 2, 4]
    two_workers = make_plan(cfg, index, Share(1, 2)).fingerprint
    assert two_workers == ours, "the number of workers is no part of the plan"
    warmer = manifest_config(tmp_path, by="speaker", temperature=0.5)
    theirs = make_plan(warmer, index).fingerprint
    assert plan_changes(ours, theirs) == [PLAN_PARTS["balance"]]
    assert plan_changes(ours, base) == [PLAN_PARTS["buckets"], PLAN_PARTS["balance"]]
    with pytest.raises(TypeError):  # made with the plan, never changed after
        plan.fingerprint["balance"] = "another"
    wrong = manifest_config(tmp_path, by="speaker", weights={"anne": 2.0})
    with pytest.raises(ConfigError, match="stager.balance.weights.anne: no speaker"):
        make_plan(wrong, index)


@pytest.mark.parametrize(
    "balance, key",
    [
        ({"by": "speaker", "temperature": 1.5}, "stager.balance.temperature"),
        ({"weights": {"en": 2.0}}, "stager.balance.weights"),
        ({"by": "language", "weights": {"en": 0.0}}, "stager.balance.weights.en"),
        ({"by": "accent"}, "stager.balance.by"),
    ],
)
def test_a_bad_balance_key_is_named(balance: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        config_from_dict({"stager": {"balance": balance}})


def test_validate_prints_the_epoch_and_every_groups_quota(tmp_path) -> None:
    cfg = manifest_config(tmp_path, by="speaker", temperature=0.0, weights={"cy": 2.0})
    lines = corpus_check(cfg, prepare(cfg)).lines
    at = next(k for k, line in enumerate(lines) if line.startswith("  balance"))
    assert "by speaker, temperature 0: 12 positions an epoch" in lines[at]
    # three of ann's clips every run skips (two longer than a slot, one out of the band:
    # validate's skip lines above): nine positions to share, none of them skipped
    assert [line.split(" (")[0].strip() for line in lines[at + 1 : at + 5]] == [
        "cy: 5 of 1 clips",
        "ann: 2 of 6 clips",
        "bob: 2 of 2 clips",
        "3 clips the length table says every run skips",
    ]
    assert "each clip 5 times" in lines[at + 1] and "each clip 0 or 1 times" in lines[at + 2]


def test_clips_whose_text_fits_no_longer_bucket_wait_and_still_come_in_pass_order() -> None:
    # The longest bucket's text is short: no clip of the others can ride there, so a
    # group whose earlier clips linger in a slow batch waits (pass_deal.py rule 3).
    text = np.where(CORPUS.of_bucket == 3, 10, 150).astype(np.int32)
    buckets = [
        Bucket(b.frames, 16 if k == 3 else 152, b.rows) for k, b in enumerate(CORPUS.buckets)
    ]
    groups = CORPUS.languages
    weights = group_weights(groups.sizes, 0.0, [1.0] * len(groups.names))
    layout = balanced_layout(groups, weights, CORPUS.of_bucket, buckets, text, SEED, 0)
    quota = quotas(weights, N_ITEMS, SEED, 0)
    assert np.array_equal(np.bincount(groups.of_item[layout.order], minlength=3), quota)
    assert early_repeats(layout.order, groups) == 0
    of_batch = np.repeat(layout.buckets, np.diff(np.append(layout.starts, len(layout.order))))
    assert (text[layout.order] <= np.array([b.text for b in buckets])[of_batch]).all()


def test_validate_warns_of_a_group_upsampled_beyond_the_rings_depth(tmp_path) -> None:
    cfg = manifest_config(tmp_path, by="speaker", temperature=0.0)  # cy: 1 clip, a third
    deep = config_from_dict(cfg.to_dict() | {"ring": {"lookahead": 16}})  # 16 x 4 rows in flight
    lines = corpus_check(deep, prepare(deep)).lines
    warned = [line for line in lines if "warning: speaker" in line]
    assert len(warned) == 3, warned  # ann 9, bob 2, cy 1 clips; each ~21 of 64 grants
    assert any("speaker cy has 1 clips but 33.3 % of the epoch" in line for line in warned)
    assert all("64 grants in flight (ring.lookahead)" in line for line in warned)
    assert all("stager.balance.temperature" in line for line in warned)
    shallow = config_from_dict(cfg.to_dict() | {"ring": {"lookahead": 1}})  # 4 in flight: 4/3 each
    lines = corpus_check(shallow, prepare(shallow)).lines
    warned = [line for line in lines if "warning: speaker" in line]
    assert len(warned) == 1 and "speaker cy has 1 clips" in warned[0]


def padding_efficiency(layout, buckets, frames) -> float:
    """True over padded mel frames of an epoch, empty rows of part-filled batches counted."""
    ends = np.append(layout.starts, len(layout.order))
    true = sum(
        int(np.minimum(frames[layout.order[s:e]], buckets[b].frames).sum())
        for s, e, b in zip(ends[:-1], ends[1:], layout.buckets, strict=True)
    )
    return true / sum(buckets[b].rows * buckets[b].frames for b in layout.buckets)


def own_bucket_efficiency(layout, buckets, of_bucket, frames) -> float:
    """padding_efficiency with every position in its own bucket and no empty row: what
    the epoch's lengths alone allow, before any dealing."""
    own = np.array([b.frames for b in buckets])[of_bucket[layout.order]]
    return float(np.minimum(frames[layout.order], own).sum() / own.sum())


def auto_buckets(lengths: list[int]) -> tuple[list[Bucket], np.ndarray]:
    of_bucket = assign(CORPUS.frames, lengths)
    rows = [max(1, 25_600 // f) for f in lengths]
    return [Bucket(f, 200, r) for f, r in zip(lengths, rows, strict=True)], of_bucket


@pytest.mark.parametrize("temperature", [0.0, 0.3, 1.0])
def test_auto_buckets_of_a_balanced_plan_fit_the_epoch_as_drawn(temperature) -> None:
    cfg = config_from_dict({"stager": {"auto_buckets": 4}})
    frames = SimpleNamespace(frames=CORPUS.frames)
    groups = CORPUS.languages
    weights = group_weights(groups.sizes, temperature, [1.0] * len(groups.names))
    plain_lengths = bucket_lengths(cfg, frames)
    drawn_lengths = bucket_lengths(cfg, frames, drawn(groups, weights))
    efficiency = {}
    for name, lengths in (("corpus", plain_lengths), ("drawn", drawn_lengths)):
        buckets, of_bucket = auto_buckets(lengths)
        layout = balanced_layout(groups, weights, of_bucket, buckets, CORPUS.text, SEED, 0)
        efficiency[name] = padding_efficiency(layout, buckets, CORPUS.frames)
    buckets, of_bucket = auto_buckets(plain_lengths)
    plain = BucketBatches(Shuffle(N_ITEMS, SEED), buckets, of_bucket).layout(0)
    plain_efficiency = padding_efficiency(plain, buckets, CORPUS.frames)
    if temperature == 1.0:  # the epoch is the corpus: the same buckets, the same padding
        assert drawn_lengths == plain_lengths
        assert abs(efficiency["drawn"] - plain_efficiency) < 1e-9
    else:  # the upweighted language speaks longer clips: longer buckets, less padding
        assert drawn_lengths != plain_lengths
        assert efficiency["drawn"] > efficiency["corpus"]
        # what the pass-by-pass dealing costs (clips riding in longer buckets' batches):
        # the epoch's lengths alone would pad less than the plain plan's
        assert plain_efficiency - efficiency["drawn"] <= PADDING_GAP
        buckets, of_bucket = auto_buckets(drawn_lengths)
        layout = balanced_layout(groups, weights, of_bucket, buckets, CORPUS.text, SEED, 0)
        assert own_bucket_efficiency(layout, buckets, of_bucket, CORPUS.frames) > plain_efficiency


# A small corpus whose rare language (100 of 2,000 clips) is drawn 4.3 times an epoch at
# temperature 0.3 and 6.7 times at 0, in batches of 32 x 800 frames: each pass of it is
# shorter than most buckets' batches take to fill (issue 49: 0.72 of the frames real at
# temperature 0 against 0.79 for plain buckets; benchmarks/balance.py --upsampled).
UPSAMPLED_GAP = 0.03


@pytest.mark.parametrize("temperature", [0.0, 0.3, 1.0])
def test_a_small_group_drawn_many_times_pads_about_as_plain_buckets_do(temperature) -> None:
    cfg = config_from_dict({"stager": {"auto_buckets": 4, "batch_size": 32}})
    for seed in (0, 1):  # the generated corpus: 1,600 / 300 / 100 clips
        corpus = lopsided_corpus(2000, seed=seed)
        table, groups = SimpleNamespace(frames=corpus.frames, text=corpus.text), corpus.languages
        weights = group_weights(groups.sizes, temperature, [1.0] * len(groups.names))
        buckets, of_bucket = make_buckets(cfg, table)  # as the stager fits each plan
        fitted, of_fitted = make_buckets(cfg, table, drawn(groups, weights))
        for epoch in (0, 1):
            plain = BucketBatches(Shuffle(2000, SEED), buckets, of_bucket).layout(epoch)
            layout = balanced_layout(groups, weights, of_fitted, fitted, corpus.text, SEED, epoch)
            assert early_repeats(layout.order, groups) == 0
            gap = padding_efficiency(plain, buckets, corpus.frames) - padding_efficiency(
                layout, fitted, corpus.frames
            )
            assert gap <= UPSAMPLED_GAP, (seed, epoch)


def skipping_config(tmp_path, **changes):
    """A jsonl corpus of the shipped clips: ann 9 clips, bob 3, cy 4 drawn at temperature 0
    (a third of the epoch each), two of cy's every run skips: one of 9.95 s (more than a
    slot of 800 frames, 9.29 s) and one whose text has nothing to speak."""
    clips = [(4, "ann"), (5, "ann"), (6, "ann"), (7, "ann"), (9, "ann"), (10, "ann")]
    clips += [(11, "ann"), (12, "ann"), (13, "ann"), (15, "bob"), (16, "bob"), (2, "bob")]
    clips += [(8, "cy"), (16, "cy"), (14, "cy"), (2, "cy")]
    lines = [
        {
            "audio": str(WAVS / f"LJ001-{wav:04d}.wav"),
            "text": "..." if k == 15 else f"the clip number {k} said aloud",
            "speaker": speaker,
            "id": f"c{k}",
        }
        for k, (wav, speaker) in enumerate(clips)
    ]
    path = write_manifest(tmp_path / "skips.jsonl", lines)
    # the texts are not what the clips say: no speaking-rate band (its own test below)
    raw = {
        "data": {"path": str(path), "format": "jsonl", "outliers": "keep"},
        "stager": {"batch_size": 4, "auto_buckets": 2, "balance": {"by": "speaker"}},
        "features": {"cache_dir": str(tmp_path / "cache")},
    }
    for key, value in changes.items():
        raw[key] = raw.get(key, {}) | value
    return config_from_dict(raw)


def test_clips_every_run_skips_keep_one_position_and_their_groups_quota_goes_to_the_others(
    tmp_path,
) -> None:
    cfg = skipping_config(tmp_path, stager={"balance": {"by": "speaker", "temperature": 0.0}})
    prepared = prepare(cfg)
    index = prepared.index
    skipped = known_skips(cfg, index)
    assert [index.item_id(i) for i in np.flatnonzero(skipped)] == ["c14", "c15"]  # cy's
    plan = make_plan(cfg, index)
    speaker = np.asarray(plan.source.groups.of_item)
    names = plan.source.groups.names
    lines = corpus_check(cfg, prepared).lines
    at = next(k for k, line in enumerate(lines) if line.startswith("  balance"))
    printed = {
        line.split(":")[0].strip(): int(line.split(": ")[1].split()[0])
        for line in lines[at + 1 : at + 4]
    }
    for epoch in range(3):
        order = plan.layout(epoch).order
        delivered = order[~skipped[order]]  # the positions the stager does not skip
        quota = plan.source.quotas(epoch)
        counts = np.bincount(speaker[delivered], minlength=len(names))
        assert counts.tolist() == quota.tolist()  # every position of the quota delivered
        assert quota.sum() == index.n_items - 2 and len(order) == index.n_items
        assert np.bincount(order, minlength=index.n_items)[skipped].tolist() == [1, 1]
        cy = (speaker == names.index("cy")) & ~skipped  # its two clips share its quota
        times = np.bincount(delivered, minlength=index.n_items)[cy]
        q = int(quota[names.index("cy")])
        assert sorted(times.tolist()) == [q // 2, q - q // 2]
        assert early_repeats_of(order, speaker, skipped) == 0
    assert printed == dict(zip(names, plan.source.quotas(0).tolist(), strict=True))
    assert "2 clips the length table says every run skips" in lines[at + 4]
    # what is skipped decides the plan: a resume that skips other clips is refused
    truncating = skipping_config(
        tmp_path,
        stager={"balance": {"by": "speaker", "temperature": 0.0}},
        features={"cache_dir": str(tmp_path / "cache"), "on_too_long": "truncate"},
    )
    prepare(truncating)
    other = make_plan(truncating, index)
    assert known_skips(truncating, index).sum() == 1  # the 9.95 s clip fits, truncated
    assert other.fingerprint["balance"] != plan.fingerprint["balance"]


def early_repeats_of(order, of_item, skipped) -> int:
    """early_repeats over the delivered positions, the skipped clips out of the groups."""
    kept = order[~skipped[order]]
    names = tuple(str(g) for g in range(int(of_item.max()) + 1))
    return early_repeats(kept, Groups(of_item, names, skipped))


def test_known_skips_follow_the_producers_rules_by_the_length_table(tmp_path) -> None:
    cfg = config_from_dict({"features": {"max_frames": 800}})
    frames = np.array([-1, 5, 9, 400, 801, 802, 803, 100_000], np.int32)
    table = SimpleNamespace(frames=frames, text=np.full(len(frames), 10, np.int32))
    per_s = cfg.audio.sample_rate / cfg.features.hop_length  # ~86 frames a second
    assert 5 * cfg.features.hop_length <= 0.1 * cfg.audio.sample_rate < 9 * 256
    # unknown: no verdict; 5 frames < 0.1 s; 802 and more: over a slot by more than the
    # header's one frame of doubt; 100,000 frames > audio.max_duration_s (60 s)
    assert header_skips(cfg, table).tolist() == [False, True, False, False, False, True, True, True]
    truncated = config_from_dict({"features": {"on_too_long": "truncate"}})
    assert header_skips(truncated, table).tolist() == [0, 1, 0, 0, 0, 0, 0, 1]
    assert 100_000 > 60 * per_s
    # out of its speaking-rate band, under data.outliers: skip only
    cfg = manifest_config(tmp_path, by="speaker")  # texts "clip k": one of 12 outside
    index = prepare(cfg).index
    out = known_skips(cfg, index)
    assert "c7" in [index.item_id(i) for i in np.flatnonzero(out)]
    flagged = config_from_dict(
        cfg.to_dict() | {"data": cfg.to_dict()["data"] | {"outliers": "flag"}}
    )
    assert "c7" not in [index.item_id(i) for i in np.flatnonzero(known_skips(flagged, index))]
