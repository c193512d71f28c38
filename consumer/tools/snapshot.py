"""What the inspector shows at one refresh: the InspectorSnapshot.

The inspector (consumer/tools/inspector.py) builds one per refresh from both
rings and the stager's last stats record (shared/run/stats_record.py, StagerStats);
:func:`consumer.tools.diagnosis.diagnose` and the terminal screen
(consumer/tools/screen.py) read it; ``inspect --json`` prints its
:meth:`InspectorSnapshot.to_dict` and ``--record`` appends one per line, which
the timeline (consumer/tools/timeline.py) reads.

to_dict keeps the flat keys the inspector has always written: the ring part
(``n_slots``, ``slots``, ``slot_bar``, ``per_slot``, ...), then, once stats
arrived (``has_stats``), the stats part as the inspector shows it (``producers``
rows with rates, ``trainer`` with its derived figures, ``padding``,
``stager_slots``, ``crashes`` as a count, ...), then ``diagnosis``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ringfeed.consumer.tools.diagnosis import Diagnosis, diagnose
from ringfeed.shared.run.stats_record import ProducerStats, StagerStats, TrainerReport

NO_STATS_NOTE = "no stats received: ring data only (is the stager publishing?)"


@dataclass(frozen=True)
class SlotView:
    """One place (a row being filled, or a spare) as its record shows it: state a
    SlotState name, age_s since its grant (or READY; None when FREE), item and producer
    index as written there."""

    slot: int
    state: str
    age_s: float | None = None
    item: int = -1
    producer: int = -1


@dataclass(frozen=True)
class RingView:
    """Both rings read from shared memory. slots: places (rows of the batches being
    filled, and spares) per SlotState name (every state listed); slot_bar: one character
    per place, or per group of places (consumer/tools/inspector.py state_bar);
    oldest_*_s: age of the oldest grant and of the oldest READY place (None: none);
    grants_by_producer_index: places held per producer index (as a string); batch_ready
    of batch_slots are sent to the trainer."""

    n_slots: int = 0
    slots: dict[str, int] = field(default_factory=dict)
    slot_bar: str = ""
    per_slot: tuple[SlotView, ...] = ()
    oldest_grant_s: float | None = None
    oldest_ready_s: float | None = None
    grants_by_producer_index: dict[str, int] = field(default_factory=dict)
    batch_slots: int = 0
    batch_ready: int = 0

    def count(self, state: str) -> int:
        """Places in the SlotState named state (0 where slots does not list it)."""
        return self.slots.get(state, 0)


@dataclass(frozen=True)
class ProducerRow:
    """One producer as the inspector lists it: rate_per_s samples/s over the last
    seconds (None: one stats message only), cache_hit_frac of its samples (None: no
    dataset work reported), where it runs."""

    name: str
    rate_per_s: float | None = None
    samples: int = 0
    grants: int = 0
    fenced: int = 0
    silent_s: float = 0.0
    stalled: bool = False
    remote: bool = False
    where: str = ""
    cache_hit_frac: float | None = None

    @classmethod
    def of(cls, pr: ProducerStats, rate_per_s: float | None) -> ProducerRow:
        hits, decoded = pr.work.get("cache_hits", 0), pr.work.get("decoded", 0)
        return cls(
            name=pr.name,
            rate_per_s=None if rate_per_s is None else round(rate_per_s, 2),
            samples=pr.samples,
            grants=pr.grants,
            fenced=pr.fenced,
            silent_s=pr.silent_s,
            stalled=pr.stalled,
            remote=pr.remote,
            where=pr.host + (f" ({pr.place})" if pr.place else ""),
            cache_hit_frac=hits / (hits + decoded) if hits + decoded else None,
        )


@dataclass(frozen=True)
class TrainerFigures:
    """What the inspector derives from the trainer's last report: wait_fraction of its
    wall time (step plus wait) spent waiting for data, samples and true mel frames per
    second of wall time (None: no time reported), age_s of the report (None: unknown)."""

    wait_fraction: float | None = None
    samples_per_s: float | None = None
    frames_per_s: float | None = None
    age_s: float | None = None

    @classmethod
    def of(cls, report: TrainerReport, now: float) -> TrainerFigures:
        """now: time.time(), the clock of report.t."""
        wall = report.step_s + report.wait_s  # step_s is the step alone; the wait comes on top
        age_s = round(now - report.t, 3) if report.t else None
        if wall <= 0:
            return cls(age_s=age_s)
        return cls(
            wait_fraction=round(report.wait_s / wall, 3),
            samples_per_s=round(report.rows / wall, 2),
            frames_per_s=round(report.frames / wall, 1),
            age_s=age_s,
        )


@dataclass(frozen=True)
class InspectorSnapshot:
    """The run at time t (time.time(), s). stats: the stager's last record (None before
    the first); producers and trainer: what the inspector derives from it; batch_size:
    rows per batch (the mean over buckets when the stats list them, else the batch ring's
    rows; None: neither known); delivered_per_s over the last seconds (None: too soon);
    stats_age_s since the last stats message arrived (None: unknown)."""

    t: float
    run_id: str
    ring: RingView
    lease_s: float | None = None
    stats: StagerStats | None = None
    producers: tuple[ProducerRow, ...] = ()
    trainer: TrainerFigures | None = None
    delivered_per_s: float | None = None
    batch_size: float | None = None
    stats_age_s: float | None = None

    @property
    def has_stats(self) -> bool:
        return self.stats is not None

    @property
    def notes(self) -> list[str]:
        return [] if self.has_stats else [NO_STATS_NOTE]

    @property
    def diagnosis(self) -> Diagnosis:
        """diagnose(self): a pure function of the snapshot, recomputed on each read."""
        return diagnose(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, the keys `inspect --json` and `--record` have always written."""
        data: dict[str, Any] = {"t": self.t, "run_id": self.run_id, **asdict(self.ring)}
        data["per_slot"] = list(data["per_slot"])
        data.update(batch_size=self.batch_size, lease_s=self.lease_s, has_stats=self.has_stats)
        data["notes"] = self.notes
        if self.stats is not None:
            data.update(self._stats_part(self.stats))
        d = self.diagnosis
        data["diagnosis"] = {"stage": d.stage, "evidence": d.evidence, "advice": d.advice}
        return data

    def _stats_part(self, stats: StagerStats) -> dict[str, Any]:
        trainer: dict[str, Any] = {}
        if stats.trainer is not None:
            trainer = {k: v for k, v in asdict(stats.trainer).items() if k != "t"}
            trainer.update(asdict(self.trainer or TrainerFigures()))
        return {
            "producers": [asdict(row) for row in self.producers],
            "producers_unlisted": stats.producers_unlisted.count,
            "uptime_s": stats.uptime_s,
            "epoch": stats.epoch,
            "cursor": stats.cursor,
            "n_items": stats.n_items,
            "batches": stats.batches,
            "padding": asdict(stats.padding_efficiency),
            "buckets": [list(shape) for shape in stats.buckets],
            "consumer_connected": stats.consumer_connected,
            "trainer": trainer,
            "counters": dict(stats.counters),
            "delivered_per_s": self.delivered_per_s,
            "stats_age_s": self.stats_age_s,
            "dropped": dict(stats.dropped),
            "skipped": stats.counters.get("skipped", 0),
            "reclaimed": stats.counters.get("reclaimed", 0),
            "bad_metadata_lines": stats.bad_metadata_lines,
            "crashes": len(stats.crashes),
            "crash_names": [c.name for c in stats.crashes],
            "stager_slots": dict(stats.slots),
            "gpus": stats.gpus,
            "features_device": stats.features_device,
        }
