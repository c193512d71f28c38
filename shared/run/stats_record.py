"""The stager's stats record: what it publishes every STATS_INTERVAL_S and writes at exit.

Each part of the stager reports its own small record (the slot ledger a
SlotStats, the producer book a BookStats, ...: the records after StagerStats);
the stager composes them (``Stager.stats()``, :meth:`StagerStats.compose`) into
one StagerStats, sent as ``protocol.Stats(record.to_dict())`` on the stats PUB
socket and written as ``runs/<run_id>/stager.json``; the inspector
(consumer/tools/inspector.py) reads it back with :meth:`StagerStats.from_dict`.
The dict keys are the field names, nested records are nested dicts and sequences
are lists, so tests and scripts that read stager.json as plain JSON
(``stats["counters"]["delivered"]``) need nothing from here.
:meth:`StagerStats.from_dict` fills a missing key with its default and ignores a
key it does not know, so a stager.json of an older or newer version still reads.

The stats message stays under the protocol's header limit by construction: at
most MAX_LISTED_PRODUCERS producers are listed (the busiest; the rest summed in
``producers_unlisted``), names and hosts are capped at decode, and the stager
keeps the work counters decode bounds (shared/wire/bounds.py MAX_WORK_KEYS;
tests/unit/test_peer_output.py checks the worst case). Peer-written strings are cleaned at
decode; :meth:`StagerStats.from_dict` cleans them again, so the inspector shows no
control character even from a stager.json an older stager wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ringfeed.shared.wire.bounds import clean

MAX_LISTED_PRODUCERS = 32
# The shard cache's counters in a producer's work, and their names in shard_cache().
SHARD_COUNTERS = {
    "shard_hits": "hits",
    "shards_fetched": "fetched",
    "shard_bytes_fetched": "bytes_fetched",
    "store_retries": "retries",
}


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of data that name a field of the dataclass cls (the rest are ignored)."""
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def _plain(value: Any) -> Any:
    """value with every tuple made a list, as it reads back from JSON or msgpack."""
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class ProducerStats:
    """One listed producer. grants: slots it holds now; fenced: slots taken back while it
    may still write them; silent_s: seconds since its last message; stalled: its grants
    were taken back and it gets nothing until it says HELLO again; work: its own
    per-sample counters from its last heartbeat (e.g. cache_hits, decoded)."""

    name: str = ""
    pid: int = 0
    host: str = ""
    place: str = ""  # its Ray actor and node when a cluster engine runs it, or ""
    remote: bool = False
    samples: int = 0
    grants: int = 0
    fenced: int = 0
    silent_s: float = 0.0
    stalled: bool = False
    work: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProducerStats:
        shown = {k: clean(str(data.get(k, ""))) for k in ("name", "host", "place")}
        work = {clean(str(k)): v for k, v in (data.get("work") or {}).items()}
        return cls(**{**_known(cls, data), **shown, "work": work})


@dataclass(frozen=True)
class UnlistedProducers:
    """The producers past MAX_LISTED_PRODUCERS, summed: how many, their samples, grants."""

    count: int = 0
    samples: int = 0
    grants: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UnlistedProducers:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class TrainerReport:
    """The trainer's last STEP_STATS: step_s computing (the wait excluded), wait_s waiting
    for its batch, rows the real rows of that batch, frames their true mel frames;
    t the stager's wall clock (time.time(), s) when it arrived, 0.0 if unknown."""

    step: int = 0
    step_s: float = 0.0
    wait_s: float = 0.0
    loss: float = 0.0
    rows: int = 0
    frames: int = 0
    t: float = 0.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainerReport:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class Padding:
    """True / padded mel frames and text tokens over every batch sent; None before one."""

    frames: float | None = None
    text: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Padding:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class CrashReport:
    """A producer's crash as the stager keeps it: its name and the traceback's tail."""

    name: str = "?"
    traceback: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CrashReport:
        name, traceback = str(data.get("name", "?")), str(data.get("traceback", ""))
        return cls(name=clean(name), traceback=clean(traceback, lines=True))


@dataclass(frozen=True)
class StagerStats:
    """The whole record. Times in seconds (uptime_s since the stager started); slots:
    sample slots per SlotState name (the states present); batch_slots_ready: batch slots
    sent and not yet freed; buckets: each bucket's batch shape (rows, frames, tokens);
    counters: the slot ledger's (runs, grants, ready, delivered, skipped, reclaimed, ...);
    dropped: messages dropped, by reason; trainer: None before the first step report;
    gpus: GPUs on the stager's host (None: not counted)."""

    run_id: str = ""
    uptime_s: float = 0.0
    n_items: int = 0
    cursor: int = 0
    epoch: int = 0
    slots: dict[str, int] = field(default_factory=dict)
    n_slots: int = 0
    batch_slots_ready: int = 0
    batches: int = 0
    padding_efficiency: Padding = field(default_factory=Padding)
    buckets: tuple[tuple[int, ...], ...] = ()
    counters: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    bad_metadata_lines: int = 0
    producers: tuple[ProducerStats, ...] = ()
    producers_unlisted: UnlistedProducers = field(default_factory=UnlistedProducers)
    crashes: tuple[CrashReport, ...] = ()
    trainer: TrainerReport | None = None
    consumer_connected: bool = False
    refused_producers: int = 0
    gpus: int | None = None
    features_device: str = ""
    lease_s: float | None = None  # ring.lease_s of the run (None: an older stager)
    # data.outliers (consumer/stager/outliers.py): clips out of their speaking-rate band
    # at start, clips listed in outliers.jsonl, delivered near-silent and clipped clips.
    outliers: dict[str, int] = field(default_factory=dict)
    # Positions skipped since this stager started, and the run's quarantined inputs
    # (quarantine.jsonl, earlier starts included), each by stage (text, audio, lease, ...).
    skipped_by_stage: dict[str, int] = field(default_factory=dict)
    quarantined_by_stage: dict[str, int] = field(default_factory=dict)

    @classmethod
    def compose(
        cls,
        run: RunStats,
        slots: SlotStats,
        book: BookStats,
        builder: BuilderStats,
        delivery: DeliveryStats,
        consumer: ConsumerStats,
        desk: DeskStats,
        control: ControlStats,
        drops: DropStats,
        outliers: OutlierStats | None = None,
    ) -> StagerStats:
        """The whole record from each part's own (the stager's stats(), once per
        STATS_INTERVAL_S and at exit)."""
        return cls(
            run_id=run.run_id,
            uptime_s=run.uptime_s,
            n_items=run.n_items,
            cursor=slots.cursor,
            epoch=slots.epoch,
            slots=slots.states,
            n_slots=slots.n_slots,
            batch_slots_ready=builder.in_flight,
            batches=delivery.batches,
            padding_efficiency=builder.padding,
            buckets=run.buckets,
            counters=slots.counters | book.counters | builder.counters(),
            dropped=drops.dropped,
            bad_metadata_lines=run.bad_metadata_lines,
            producers=book.producers,
            producers_unlisted=book.unlisted,
            crashes=desk.crashes,
            trainer=consumer.trainer,
            consumer_connected=consumer.connected,
            refused_producers=control.refused_producers,
            gpus=run.gpus,
            features_device=run.features_device,
            lease_s=run.lease_s,
            outliers=outliers.counts if outliers is not None else {},
            skipped_by_stage=delivery.skipped,
            quarantined_by_stage=delivery.quarantined,
        )

    def shard_cache(self) -> dict[str, int]:
        """The shard cache's counters summed over the listed producers (hits, fetched,
        bytes_fetched, retries; shared/corpus/object_store.py), {} when none reads shards
        from object storage."""
        work = [pr.work for pr in self.producers]
        if not any(key in w for w in work for key in SHARD_COUNTERS):
            return {}
        return {tag: sum(w.get(key, 0) for w in work) for key, tag in SHARD_COUNTERS.items()}

    def to_dict(self) -> dict[str, Any]:
        """Plain data (dicts, lists, numbers, strings, None) for msgpack and JSON."""
        data = _plain(asdict(self))
        data["trainer"] = data["trainer"] or {}  # no report yet: {}, as stager.json always had
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StagerStats:
        """The record from what to_dict gave (or an older stager.json): missing keys take
        their defaults, unknown keys are ignored."""
        trainer, producers = data.get("trainer"), data.get("producers") or ()
        nested = {
            "slots": dict(data.get("slots") or {}),
            "padding_efficiency": Padding.from_dict(data.get("padding_efficiency") or {}),
            "buckets": tuple(tuple(shape) for shape in data.get("buckets") or ()),
            "counters": dict(data.get("counters") or {}),
            "dropped": dict(data.get("dropped") or {}),
            "outliers": dict(data.get("outliers") or {}),
            "skipped_by_stage": dict(data.get("skipped_by_stage") or {}),
            "quarantined_by_stage": dict(data.get("quarantined_by_stage") or {}),
            "producers": tuple(ProducerStats.from_dict(pr) for pr in producers),
            "producers_unlisted": UnlistedProducers.from_dict(data.get("producers_unlisted") or {}),
            "crashes": tuple(CrashReport.from_dict(c) for c in data.get("crashes") or ()),
            "trainer": TrainerReport.from_dict(trainer) if trainer else None,
        }
        return cls(**{**_known(cls, data), **nested})


# ------------------------------------------------------------ each part's own record


@dataclass(frozen=True)
class RunStats:
    """The stager's own: seconds since it started, the corpus (usable items, metadata
    lines it could not use), each bucket's batch shape (rows, frames, tokens), where the
    work can run (GPUs on its host, None: not counted; features.device), ring.lease_s."""

    run_id: str
    uptime_s: float
    n_items: int
    buckets: tuple[tuple[int, ...], ...]
    bad_metadata_lines: int
    gpus: int | None
    features_device: str
    lease_s: float


@dataclass(frozen=True)
class SlotStats:
    """The slot ledger's: the cursor (the first position of the oldest batch not sent)
    and its epoch, places per SlotState name (the states present: batch rows and spare
    slots together), the places, and its counters (runs, grants, ready, delivered,
    skipped, reclaimed, ...)."""

    cursor: int
    epoch: int
    states: dict[str, int]
    n_slots: int
    counters: dict[str, int]


@dataclass(frozen=True)
class BookStats:
    """The producer book's: the producers listed (working ones first, at most
    MAX_LISTED_PRODUCERS), the rest summed, and its counters (restarts, strikes,
    peers_banned)."""

    producers: tuple[ProducerStats, ...]
    unlisted: UnlistedProducers
    counters: dict[str, int]


@dataclass(frozen=True)
class BuilderStats:
    """The batch builder's: batch slots sent and not yet freed, the padding, and with
    stager mels how often its device failed and the CPU took over (mel_fallbacks), the
    rows that came as mels from a producer's feature cache (mels_from_cache), and the mels
    it computed that went into this host's cache (mels_kept) or not (mels_not_kept: its
    queue or its disk full)."""

    in_flight: int
    padding: Padding
    mel_fallbacks: int = 0
    mels_from_cache: int = 0
    mels_kept: int = 0
    mels_not_kept: int = 0

    def counters(self) -> dict[str, int]:
        """Its counters, as stager.json's counters hold them."""
        return {
            "mel_fallbacks": self.mel_fallbacks,
            "mels_from_cache": self.mels_from_cache,
            "mels_kept": self.mels_kept,
            "mels_not_kept": self.mels_not_kept,
        }


@dataclass(frozen=True)
class DeliveryStats:
    """Delivery's: batches announced since the consumer (re)started, its start included;
    positions skipped by this stager, by stage; the quarantine file's items by stage."""

    batches: int
    skipped: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ConsumerStats:
    """The consumer side's: is a consumer connected, and its last step report."""

    connected: bool
    trainer: TrainerReport | None


@dataclass(frozen=True)
class DeskStats:
    """The producer desk's: the latest producer crashes kept."""

    crashes: tuple[CrashReport, ...]


@dataclass(frozen=True)
class ControlStats:
    """The control sockets': producers refused at the tcp handshake (keys, ZAP)."""

    refused_producers: int


@dataclass(frozen=True)
class DropStats:
    """Messages dropped, by reason (consumer/stager/drops.py)."""

    dropped: dict[str, int]


@dataclass(frozen=True)
class OutlierStats:
    """The outlier report's (consumer/stager/outliers.py): out_of_band, listed,
    near_silent, clipped."""

    counts: dict[str, int]
