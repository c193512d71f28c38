"""Audio that is not its text, at the stager: data.outliers, and the run's outliers.jsonl.

At start (:func:`out_of_band_clips`, from consumer/stager/stager.py build), with
data.outliers not keep and a corpus with audio: the length table (as preparation
measured it, plan/buckets.py length_table), each language's speaking-rate
band and the clips outside it or outside the plausibility bound that holds for every
language, however few its clips (shared/corpus/speaking_rate.py). Then
:meth:`OutlierReport.start`: with skip each is marked bad in the slot ledger
before any grant, and becomes a quarantine line (stage "outlier", with its rate
and band) when the plan reaches it; with flag each is listed in outliers.jsonl
now and delivered as any clip.

Clips whose audio a producer marked near-silent or clipped (shared/sample/marks.py)
are skipped by that producer with skip (stage "outlier"), and with flag come in
their READY's marks: the intake calls :meth:`OutlierReport.delivered` when it puts
one into a batch, and it is listed then.

outliers.jsonl: one JSON line per clip per run, ``{"item_id", "path", "kind", "why",
"time"}`` (kind: "rate", "near-silent", "clipped" or "near-silent+clipped"), written
by the stager only and line-buffered, so ``jq`` works on a live run; a clip already
in the file (a stager restarted into the same run directory) is not written again.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from ringfeed.consumer.stager.ledger.face import SlotLedger
from ringfeed.consumer.stager.plan.buckets import length_table
from ringfeed.consumer.stager.quarantine import OUTLIER_STAGE
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.lengths import load_lengths
from ringfeed.shared.corpus.object_store import is_remote
from ringfeed.shared.corpus.speaking_rate import (
    MIN_CLIPS,
    OutOfBand,
    RateBand,
    out_of_band,
    rate_bands,
)
from ringfeed.shared.run.stats_record import OutlierStats
from ringfeed.shared.sample import marks as m

log = logging.getLogger(__name__)

REPORT_FILE = "outliers.jsonl"
# Out-of-band clips the stager's log names at start; the rest are counted.
LOGGED = 5


def out_of_band_clips(cfg: Config, index: CorpusIndex) -> list[OutOfBand]:
    """The clips outside their language's speaking-rate band ([] with data.outliers:
    keep, or a corpus without audio), by the length table preparation measured."""
    if cfg.data.outliers == "keep" or not index.has_audio:
        return []
    if is_remote(cfg.data.path) and load_lengths(cfg, index)[1].any():
        # Measuring reads every clip's header, so every shard from object storage: the
        # user asks for that (`ringfeed lengths CONFIG`, or length buckets), not a default.
        log.warning(
            "data.outliers: no speaking-rate band: the length table of a corpus "
            "on object storage is not measured (`ringfeed lengths CONFIG` measures "
            "it, fetching every shard); near-silent and clipped clips are still "
            "found"
        )
        return []
    lengths = length_table(cfg, index, "data.outliers")
    bands = rate_bands(cfg, index, lengths)
    for band in bands.values():
        log.info("speaking-rate band %s: %s, %d clips", band.language, band.describe(), band.clips)
    unbanded = sorted(set(index.languages) - set(bands))
    if unbanded:
        log.info(
            "no speaking-rate band (fewer than %d clips): %s; the plausibility bound "
            "%s holds for them too",
            MIN_CLIPS,
            ", ".join(unbanded),
            RateBand.bound("").describe(),
        )
    return out_of_band(cfg, index, lengths, bands)


def earlier_skips(cfg: Config, skips: dict[int, tuple[str, str]]) -> dict[int, tuple[str, str]]:
    """The quarantine's earlier skips that still hold: an outlier's only under skip (a
    run resumed with flag or keep delivers the clips it had skipped)."""
    if cfg.data.outliers == "skip":
        return skips
    return {item: why for item, why in skips.items() if why[1] != OUTLIER_STAGE}


class OutlierReport:
    """outliers.jsonl (module docstring) and the counts of the stager's stats."""

    def __init__(self, cfg: Config, directory: Path, index: CorpusIndex) -> None:
        self.policy, self.index = cfg.data.outliers, index
        self.path = directory / REPORT_FILE
        self.counts = {"out_of_band": 0, "listed": 0, "near_silent": 0, "clipped": 0}
        self._listed: set[str] = set()
        self._file = None
        if self.policy == "flag":
            self._listed = {r["item_id"] for r in _read(self.path)}
            self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            if self._file.tell() and not self.path.read_bytes().endswith(b"\n"):
                self._file.write("\n")  # a crash cut the last line: the next starts fresh

    def start(self, found: list[OutOfBand], slots: SlotLedger) -> None:
        """The out-of-band clips as the policy takes them: skip marks them bad (no grant),
        flag lists them."""
        self.counts["out_of_band"] = len(found)
        if not found:
            return
        for o in found[:LOGGED]:
            log.warning("out of band: %s: %s", self.index.item_id(o.item), o.reason())
        more = f" ({len(found) - LOGGED} more)" if len(found) > LOGGED else ""
        if self.policy == "skip":
            slots.mark_bad({o.item: (o.reason(), OUTLIER_STAGE) for o in found})
            log.warning(
                "data.outliers: skip: %d clips outside their speaking-rate band%s are "
                "skipped (quarantine.jsonl, stage outlier)",
                len(found),
                more,
            )
            return
        for o in found:
            self.write(o.item, "rate", o.reason())
        log.warning(
            "data.outliers: flag: %d clips outside their speaking-rate band%s are "
            "delivered and listed in %s",
            len(found),
            more,
            self.path,
        )

    def delivered(self, item: int, marks: int) -> None:
        """A clip a producer marked near-silent or clipped went into a batch: listed and
        counted once a run (flag; the other policies never deliver one with audio marks)."""
        if self.policy != "flag" or not marks & m.AUDIO:
            return
        kinds = m.audio_kinds(marks)
        if self.write(item, "+".join(kinds), f"audio {m.describe_audio(marks)}"):
            for kind in kinds:
                self.counts[kind.replace("-", "_")] += 1

    def write(self, item: int, kind: str, why: str) -> bool:
        """One line for the clip; False if it is listed already (or nothing is listed)."""
        item_id = self.index.item_id(item)
        if self._file is None or item_id in self._listed:
            return False
        self._listed.add(item_id)
        record = {
            "item_id": item_id,
            "path": self.index.path(item),
            "kind": kind,
            "why": why,
            "time": time.time(),
        }
        self._file.write(json.dumps(record) + "\n")
        self.counts["listed"] += 1
        return True

    def stats(self) -> OutlierStats:
        return OutlierStats(dict(self.counts))

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()


def _read(path: Path) -> list[dict]:
    """The records of an outliers.jsonl (none if missing); a line cut by a crash is skipped."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "item_id" in record:
            records.append(record)
    return records
