"""A generated lopsided corpus for the balance tests and benchmarks/balance.py: three
languages with 80 / 15 / 5 % of the clips, speakers of Zipf-like sizes within each,
and clip lengths that differ by language (the rare one speaks longer clips)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ringfeed.consumer.stager.plan.balance import Groups
from ringfeed.consumer.stager.plan.buckets import Bucket, assign

LANGUAGE_SHARES = (0.80, 0.15, 0.05)
SPEAKERS_PER_LANGUAGE = (12, 6, 3)
MEAN_FRAMES = (300, 330, 420)  # per language; lognormal around these
BUCKET_FRAMES = (200, 300, 450, 800)
BATCH_FRAMES = 25_600  # 32 rows of 800 frames


@dataclass(frozen=True)
class Corpus:
    languages: Groups
    speakers: Groups
    frames: np.ndarray  # int32 [n]: mel frames of each clip
    text: np.ndarray  # int32 [n]: tokens of each clip
    of_bucket: np.ndarray  # int32 [n]: its bucket among BUCKETS
    buckets: list[Bucket]


def lopsided_corpus(n: int, seed: int = 0, batch_frames: int = BATCH_FRAMES) -> Corpus:
    """n clips; buckets BUCKET_FRAMES with batch_frames // frames rows and the text
    length of their longest clip (as buckets.make_buckets makes them)."""
    rng = np.random.default_rng(seed)
    counts = np.floor(np.array(LANGUAGE_SHARES) * n).astype(np.int64)
    counts[0] += n - counts.sum()
    language = rng.permutation(np.repeat(np.arange(3, dtype=np.int32), counts))
    speaker = np.empty(n, np.int32)
    names, first = [], 0
    for lang, k in enumerate(SPEAKERS_PER_LANGUAGE):
        zipf = 1.0 / np.arange(1, k + 1) ** 1.3
        mine = np.flatnonzero(language == lang)
        speaker[mine] = first + rng.choice(k, size=len(mine), p=zipf / zipf.sum())
        names += [f"{'abc'[lang]}{s:02d}" for s in range(k)]
        first += k
    mean = np.array(MEAN_FRAMES, np.float64)[language]
    frames = np.clip(rng.lognormal(np.log(mean), 0.35), 40, 800).astype(np.int32)
    text = np.clip(frames // 4, 4, 200).astype(np.int32)
    of_bucket = assign(frames, list(BUCKET_FRAMES))
    longest = np.zeros(len(BUCKET_FRAMES), np.int64)
    np.maximum.at(longest, of_bucket, text)
    buckets = [
        Bucket(f, int(-(-max(1, t) // 8) * 8), max(1, batch_frames // f))
        for f, t in zip(BUCKET_FRAMES, longest, strict=True)
    ]
    languages = Groups(language, ("a", "b", "c"))
    return Corpus(languages, Groups(speaker, tuple(names)), frames, text, of_bucket, buckets)


def early_repeats(order: np.ndarray, groups: Groups, sizes: np.ndarray | None = None) -> int:
    """Clips that come again, in `order` (one epoch's items in delivery order), before
    every clip of their group came as often: cut each group's clips in order into runs
    of its size (sizes: each group's clips where order draws from, e.g. a shard window;
    default all of them), a clip twice in one run is one."""
    early = 0
    of_group = groups.of_item[order]
    for g, size in enumerate((groups.sizes if sizes is None else sizes).tolist()):
        mine = order[of_group == g]
        for lo in range(0, len(mine), max(1, size)):
            run = mine[lo : lo + size]
            early += len(run) - len(np.unique(run))
    return early
