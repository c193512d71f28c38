"""What `ringfeed validate` says of audio that is not its text (data.outliers).

:func:`rate_lines`: each language's speaking-rate band and the clips outside it, as
the stager will find them at start (shared/corpus/speaking_rate.py, from the length
table that preparation measured: headers and the producers' tokens).
:func:`deep_lines` (`validate CONFIG --deep`): every clip decoded as a producer decodes
it, in parallel processes with a progress line, for what no header shows: a body cut
short or undecodable past its header, NaNs, clips too short after trimming or too long
after decoding, near-silent and clipped audio (shared/sample/marks.py). A header read
cost 0.3 ms a clip and a decode 3-5 ms on the shipped clips (none resampled;
docs/corpora.md#audio-that-is-not-its-text), so the deep check is asked for, not the
default, for corpora of many hours.
"""

from __future__ import annotations

import collections
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from ringfeed.shared.config import Config
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.lengths import Lengths
from ringfeed.shared.corpus.object_store import is_remote
from ringfeed.shared.corpus.speaking_rate import (
    BAND_K,
    MAX_RATE,
    MIN_CLIPS,
    MIN_RATE,
    MIN_SPREAD,
    out_of_band,
    rate_bands,
)

# Clips named as examples of each finding.
EXAMPLES = 3
# The deep check's progress line comes this often on stderr, seconds.
PROGRESS_S = 5.0
# Clips a deep-check process decodes per task: few enough to spread the work evenly.
CHUNK = 32
# How validate says what data.outliers will do with what it finds.
VERB = {"skip": "skip", "flag": "flag", "keep": "note"}


def rate_lines(
    cfg: Config, index: CorpusIndex, clean: set[int], lengths: Lengths | None
) -> tuple[list[str], int]:
    """(validate's speaking-rate lines, how many clips no header rule skips that the band
    will skip: 0 unless data.outliers is skip), from the length table preparation
    measured (None: not measured, as no run of this config reads it). clean: the items no
    header rule skips."""
    if lengths is None and is_remote(cfg.data.path):  # as the stager finds it
        return [
            "  speaking rate no band: the length table of a corpus on object storage is "
            "not measured (`ringfeed lengths CONFIG` measures it, fetching every shard)"
        ], 0
    if lengths is None:
        return ["  speaking rate not judged (data.outliers: keep)"], 0
    bands = rate_bands(cfg, index, lengths)
    found = out_of_band(cfg, index, lengths, bands)
    policy = cfg.data.outliers
    spread = f"{BAND_K:g} x max(1.4826 MAD, {MIN_SPREAD:g})"
    lines = [
        f"  speaking rate tokens per second by the audio header; band: the log rate's "
        f"median +- {spread} (data.outliers: {policy})"
    ]
    lines.append(
        f"                plausibility bound of every language, from the first clip: "
        f"{MIN_RATE:g} .. {MAX_RATE:g}"
    )
    outside = collections.Counter(o.band.language for o in found)
    for language in index.languages:
        band = bands.get(language)
        if band is None:
            lines.append(
                f"    {language:10s} no band: fewer than {MIN_CLIPS} clips with a rate; "
                f"the bound alone, {outside[language]} outside"
            )
            continue
        edges = f"{band.low:5.1f} .. {band.high:5.1f}"
        lines.append(
            f"    {language:10s} {band.clips:8d} clips  median {band.median:5.1f}  "
            f"band {edges}  {outside[language]} outside"
        )
    if found:
        fix = {
            "skip": "quarantined (stage outlier)",
            "flag": "delivered, listed in outliers.jsonl",
            "keep": "delivered (data.outliers: keep)",
        }[policy]
        lines.append(
            f"    {VERB[policy]} {len(found):8d} outside their language's band or the bound: {fix}"
        )
        for o in found[:EXAMPLES]:
            what = "bound" if o.band.fixed else "band"
            lines.append(
                f"      e.g. {index.item_id(o.item)}: {o.rate:.1f} tokens/s, {what} "
                f"{o.band.low:.1f} .. {o.band.high:.1f} ({o.band.language})"
            )
    skipped = sum(o.item in clean for o in found) if policy == "skip" else 0
    return lines, skipped


def deep_lines(cfg: Config, workers: int = 0) -> list[str]:
    """validate --deep's lines: every clip decoded by `workers` processes (0: one per
    core), findings counted by kind with examples."""
    from ringfeed.shared.corpus.open import open_prepared

    index = open_prepared(cfg)
    workers = workers or len(os.sched_getaffinity(0))
    chunks = [range(k, min(k + CHUNK, index.n_items)) for k in range(0, index.n_items, CHUNK)]
    found: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    t0 = shown = time.monotonic()
    done = 0
    with ProcessPoolExecutor(workers, initializer=_open, initargs=(cfg,)) as pool:
        for future in as_completed([pool.submit(_judge, list(c)) for c in chunks]):
            for item_id, kind, reason in future.result():
                found[kind].append((item_id, reason))
            done += CHUNK
            if time.monotonic() - shown > PROGRESS_S:
                shown = time.monotonic()
                done_now, rate = min(done, index.n_items), done / (shown - t0)
                left = (index.n_items - done_now) / max(rate, 1e-9)
                print(
                    f"validate --deep: decoded {done_now} of {index.n_items} clips "
                    f"({rate:.0f}/s, ~{left:.0f} s left)",
                    file=sys.stderr,
                )
    return _deep_summary(cfg, index.n_items, found, time.monotonic() - t0, workers)


def _deep_summary(
    cfg: Config, n_items: int, found: dict[str, list[tuple[str, str]]], seconds: float, workers: int
) -> list[str]:
    bad = sum(len(v) for k, v in found.items() if k != "outlier" or cfg.data.outliers == "skip")
    lines = [
        f"  deep check    {n_items} clips decoded in {seconds:.1f} s by {workers} "
        f"processes: {n_items - bad} usable"
    ]
    for kind, hits in sorted(found.items(), key=lambda kv: -len(kv[1])):
        verb = VERB[cfg.data.outliers] if kind == "outlier" else "skip"
        groups = collections.defaultdict(list)
        for item_id, reason in hits:  # one line per reason, numbers aside
            groups[re.sub(r"\d+(\.\d+)?", "_", reason)].append((item_id, reason))
        for group in sorted(groups.values(), key=len, reverse=True):
            named = ", ".join(item_id for item_id, _ in group[:EXAMPLES])
            lines.append(f"    {verb} {len(group):8d} {group[0][1]} (e.g. {named})")
    return lines


# A deep-check process's corpus index (mapped) and config, set once at its start.
_WORKER: dict[str, Any] = {}


def _open(cfg: Config) -> None:
    from ringfeed.shared.corpus.open import open_prepared

    _WORKER.update(index=open_prepared(cfg), cfg=cfg)


def _judge(items: list[int]) -> list[tuple[str, str, str]]:
    """(item id, kind, reason) of each of `items` whose decode finds something: kind
    "audio" (a producer would skip it whatever data.outliers says) or "outlier"."""
    from ringfeed.producer.audio.decode import load_clip
    from ringfeed.producer.features.mel import fit_length
    from ringfeed.producer.sample import SkipSample
    from ringfeed.shared.corpus.clips import ClipReader
    from ringfeed.shared.sample.marks import describe_audio

    index, cfg = _WORKER["index"], _WORKER["cfg"]
    clips, out = ClipReader(cfg), []
    for item in items:
        entry = index.entry(item)
        try:
            wave, marks = load_clip(clips, entry, cfg)
            fit_length(wave, cfg, entry.audio_path)
        except (SkipSample, OSError) as exc:
            out.append((entry.item_id, "audio", getattr(exc, "reason", str(exc))))
            continue
        if marks:
            out.append((entry.item_id, "outlier", f"audio {describe_audio(marks)}"))
    return out
