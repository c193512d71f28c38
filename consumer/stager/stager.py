"""The stager: the data process (GPU:0 when features.device is stager).

It owns both rings (the batch ring, whose rows producers write in place, and the
spare ring) and the plan. Main loop: poll messages, expire leases, grant runs,
announce finished batches, publish stats, check stop. :func:`build` makes every
part complete, each by keyword from its own terms and handed what it uses
(consumer/stager/):

    Plan           which item at each position, in which batch, whose share (plan/)
    Ledger         the one owner of place, position and batch-slot state, a table of
                   numpy columns behind the SlotLedger face (ledger/): grants, fences,
                   backups and audits, batches in plan order; every other part is typed
                   against the face (mypy, in .ci/run)
    ProducerBook   who the producers are; fair share; who pays for a lost grant
    ProducerDesk   producer messages in (one handler per kind), GRANTs out
    Intake         READY and SKIP checks, a remote producer's rows copied in, audits,
                   who pays for rows that fail
    Assembly       a finished batch's rows checked (seqlock, values, checksum: one
                   read), closed up and completed with the stager's own columns
    CacheWriter    with stager mels, those it computed kept in this host's feature
                   cache, by a thread of its own
    Delivery       batches announced; skips into quarantine.jsonl
    OutlierReport  data.outliers: out-of-band clips skipped or listed (outliers.jsonl)
    ConsumerSide   the one authenticated consumer and its messages

Each part reports its own stats record; :meth:`Stager.stats` composes them into
the one StagerStats of the stats stream and stager.json (shared/run/stats_record.py).

A malformed, oversized or stale message is dropped and counted, never fatal.
On exit (stop flag, SIGTERM, or the consumer's BYE) it tells producers to
stop, writes stager.json into the run directory, and unlinks both segments
(whatever of them setup had made: each is registered for cleanup as it is made).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ringfeed.consumer.devices import GpuProbe, stager_mel_fn
from ringfeed.consumer.stager.assembly import Assembly
from ringfeed.consumer.stager.audits import AuditPolicy
from ringfeed.consumer.stager.cache_writer import STOPPED_WAIT_S, CacheWriter
from ringfeed.consumer.stager.consumer_side import ConsumerGone, ConsumerSide
from ringfeed.consumer.stager.control import ControlSockets
from ringfeed.consumer.stager.delivery import Delivery, NothingDelivered
from ringfeed.consumer.stager.drops import Drops
from ringfeed.consumer.stager.intake import Intake
from ringfeed.consumer.stager.ledger.face import SlotLedger
from ringfeed.consumer.stager.ledger.table import Ledger, LedgerTerms, PlaceRecords
from ringfeed.consumer.stager.numpy_mel import NumpyLogMel
from ringfeed.consumer.stager.outliers import OutlierReport, earlier_skips, out_of_band_clips
from ringfeed.consumer.stager.peers import MALFORMED_PER_STRIKE, PeerId
from ringfeed.consumer.stager.plan.make import make_plan
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.producer_book import BookTerms, ProducerBook
from ringfeed.consumer.stager.producer_desk import ProducerDesk
from ringfeed.consumer.stager.quarantine import QuarantineWriter, run_quarantine
from ringfeed.shared.config import Config, ConfigError
from ringfeed.shared.config.config import SHM_SHARE
from ringfeed.shared.config.environment import (
    Endpoints,
    endpoints,
    ensure_runtime_dir,
    run_dir,
    shm_total_bytes,
)
from ringfeed.shared.corpus.entry import CorpusError
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.open import open_prepared
from ringfeed.shared.memory.disk import DiskFull, disk_error, is_full
from ringfeed.shared.memory.places import Places
from ringfeed.shared.memory.ring import Ring, check_rings_fit, segment_name, slot_bytes
from ringfeed.shared.memory.segments import remove_stale_segments
from ringfeed.shared.run.fingerprint import config_fingerprint, corpus_digest
from ringfeed.shared.run.id_tables import IDS_FILE, settle_tables
from ringfeed.shared.run.process import (
    POLL_S,
    STAGER_NO_CONSUMER,
    StopFlag,
    Stopped,
    write_json_atomic,
)
from ringfeed.shared.run.prosody_table import keep_in_run
from ringfeed.shared.run.run_clock import RunClock
from ringfeed.shared.run.run_secret import write_consumer_secret, write_run_record
from ringfeed.shared.run.share import ONE_WORKER, Share
from ringfeed.shared.run.stats_record import RunStats, StagerStats
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.bounds import MAX_READY_PAYLOAD_BYTES

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
LEASE_CHECK_S = 0.1


@dataclass(frozen=True)
class Stager:
    """Every part of one stager that its loop, its stats and its ending use; made by
    :func:`build` (the rings, the quarantine and the intake are held by the parts that
    use them and undone by build's cleanup)."""

    cfg: Config
    run_id: str
    stop: StopFlag
    index: CorpusIndex
    plan: Plan
    net: ControlSockets
    drop: Drops
    ledger: SlotLedger
    book: ProducerBook
    assembly: Assembly
    delivery: Delivery
    producers: ProducerDesk
    consumer: ConsumerSide
    outliers: OutlierReport
    gpus: GpuProbe  # GPUs the stager's host has (the inspector's advice depends on it)
    t_start: float
    cache_writer: CacheWriter | None = None  # stager mels with the feature cache on

    def run(self) -> None:
        """Poll, expire leases, grant, deliver, publish, until stopped or done."""
        # The first stats wait an interval: the first grants and batches go first.
        next_lease, next_stats = 0.0, time.monotonic() + STATS_INTERVAL_S
        while not self.stop.is_set() and not self.consumer.done:
            for incoming in self.net.receive(POLL_S):
                self.route(*incoming)
            now = time.monotonic()
            if now >= next_lease:
                self.producers.expire(self.cfg.ring.lease_s)
                self.consumer.check_present(self.book.clock(), self.cfg.stager.consumer_wait_s)
                next_lease = now + LEASE_CHECK_S
            if self.consumer.ident is not None:  # its cursor says where the plan starts
                self.producers.grant()
                self.delivery.deliver(self.consumer.ident)
            if now >= next_stats:
                self.net.publish(p.Stats(self.stats().to_dict()))
                next_stats = now + STATS_INTERVAL_S

    def route(
        self, ident: bytes, msg: p.Message, payload: list[bytes], peer: PeerId | None
    ) -> None:
        """Hellos and the consumer's messages first, then a known producer's by kind;
        anything else is dropped and counted. peer: who sent a (CONSUMER_)HELLO."""
        producer = self.book.touch(ident)
        if producer is not None and producer.stalled and not isinstance(msg, p.Hello):
            self.net.reply(ident, p.Rehello())  # its queued grants are void: start over
        if isinstance(msg, p.ConsumerHello):
            self.consumer.hello(ident, msg, peer)
        elif ident == self.consumer.ident and not isinstance(msg, p.Hello):
            if not self.consumer.handle(msg):
                self.drop("unexpected", f"{type(msg).__name__} from the consumer")
        elif isinstance(msg, p.Hello) and peer is not None:
            self.producers.hello(ident, msg, peer)
        elif producer is None and isinstance(msg, p.Bye) and self.book.left_with_bye(ident):
            self.net.reply(ident, p.ByeAck())  # said again: our BYE_ACK was lost or late
        elif producer is None:
            if name := self.book.was_forgotten(ident):
                self.drop(
                    "late",
                    f"{type(msg).__name__} from {name}, given up for its silence"
                    " (paused, or its link was cut); it says HELLO again",
                )
            else:
                self.drop("unknown-peer", f"{type(msg).__name__} from a peer that never said HELLO")
            self.net.reply(ident, p.Rehello())  # a producer of a previous stager
        else:
            self.producers.handle(producer, msg, payload)

    def stats(self) -> StagerStats:
        """Everything the inspector and stager.json show: each part's own record."""
        run = RunStats(
            run_id=self.run_id,
            uptime_s=round(time.monotonic() - self.t_start, 3),
            n_items=self.index.n_items,
            buckets=tuple(b.shape for b in self.plan.buckets),
            bad_metadata_lines=len(self.index.bad_lines),
            # Where the work can run: the trainer shares the stager's host, on a GPU if any.
            gpus=self.gpus.count(),  # None until the probe answers
            features_device=self.cfg.features.device,
            lease_s=self.cfg.ring.lease_s,
        )
        return StagerStats.compose(
            run,
            self.ledger.stats(),
            self.book.stats(),
            self.assembly.stats(self.ledger.progress().in_flight),
            self.delivery.stats(),
            self.consumer.stats(),
            self.producers.stats(),
            self.net.stats(),
            self.drop.stats(),
            self.outliers.stats(),
        )

    def finish(self, why: str = "stager stopping") -> None:
        """Stop the peers and record the run (stager.json); the rings are unlinked by
        the cleanup :func:`build` registered. why: what the consumer is told."""
        if self.consumer.ident is not None and not self.consumer.done:
            self.net.reply(self.consumer.ident, p.Shutdown(why))
        self.producers.shut_down("run finished" if self.consumer.done else why)
        if self.cache_writer is not None:  # its last mels kept, and counted, first
            self.cache_writer.close(STOPPED_WAIT_S if self.stop.is_set() else None)
        stats = self.stats()
        path = run_dir(self.cfg, self.run_id) / "stager.json"
        try:
            write_json_atomic(path, stats.to_dict())
        except OSError as exc:  # the counters still go to the log, below
            if not is_full(exc):
                raise
            log.error("stager.json not written: %s", disk_error(exc, path))
        time.sleep(POLL_S)  # let the SHUTDOWNs leave; leases cover a lost one
        log.info("stager done: %s", json.dumps(stats.counters))


def open_rings(cfg: Config, run_id: str, stats: str, cleanup: contextlib.ExitStack, stop: StopFlag):
    """Create the spare ring and the batch ring (a record per row), each unlinked at
    cleanup however the run ends; the ledger's view of the records is swapped for a
    copy first (no view of a ring outlives its map)."""
    rings = []
    for kind, fields, n_slots, rows in (
        ("spares", cfg.sample_fields(), cfg.spare_slots, 0),
        ("batches", cfg.batch_ring_fields(), cfg.batch_ring_slots, cfg.max_batch_rows),
    ):
        with stop.held():  # no Stopped between its creation and its unlink's
            ring = Ring.create(
                segment_name(run_id, kind), fields, n_slots, run_id, kind, stats, rows
            )
            cleanup.callback(ring.unlink)
            cleanup.callback(ring.close)
        rings.append(ring)
    return rings


def open_index(cfg: Config, quarantine: QuarantineWriter, directory) -> CorpusIndex:
    index = open_prepared(cfg)  # preparation built it: nothing is built here
    for bad in index.bad_lines:
        quarantine.write(bad.item_id, f"{bad.file}:{bad.line}", bad.reason, "metadata")
    log.info(
        "dataset: %d items in the index, %d bad metadata lines (see %s; clips the "
        "producers skip are quarantined when met: validate's 'usable' counts those no "
        "header rule or speaking-rate band skips)",
        index.n_items,
        len(index.bad_lines),
        directory / "quarantine.jsonl",
    )
    if cfg.features.pitch_norm != "none":  # what the producers apply, kept for inference
        keep_in_run(cfg, index.digest, directory)
    return index


def prepare_run_dir(cfg: Config, run_id: str) -> Path:
    """The run directory with this config in it, once the host can hold the run: stale
    segments removed, the private runtime directory there, the rings fitting."""
    directory = run_dir(cfg, run_id)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(cfg.to_yaml())
    remove_stale_segments()
    ensure_runtime_dir()  # 0700: the ipc sockets are this user's only
    check_rings_fit(cfg)
    return directory


def build(
    cfg: Config,
    run_id: str,
    stop: StopFlag,
    cleanup: contextlib.ExitStack,
    share: Share = ONE_WORKER,
) -> Stager:
    """Make every part of the stager, complete; whatever is made is undone by `cleanup`
    (rings unmapped and unlinked, sockets and files closed), however far this got."""
    directory = prepare_run_dir(cfg, run_id)
    record = write_run_record(run_id, directory)  # where a client from elsewhere finds it
    cleanup.callback(record.unlink, missing_ok=True)
    quarantine_file = run_quarantine(directory, run_dir(cfg, share.base_run_id(run_id)))
    quarantine = cleanup.enter_context(QuarantineWriter(quarantine_file))
    index = open_index(cfg, quarantine, directory)
    tables = settle_tables(cfg, index, directory)  # a refused resume stops here, first
    log.info(
        "id tables: %d speakers, %d languages (%s)",
        len(tables.speakers),
        len(tables.languages),
        directory / IDS_FILE,
    )
    ends = endpoints(cfg, run_id)
    spares, batches = open_rings(cfg, run_id, ends.stats, cleanup, stop)
    plan = make_plan(cfg, index, share, tables)
    plan.item_at(0)  # epoch 0 drawn now, while producers start: 0.4 s at 10**7 items
    clock = RunClock(cfg.ring.lease_s)
    ledger = slot_ledger(cfg, plan, spares, batches, clock, cleanup)
    outliers = outlier_report(cfg, index, directory, ledger, cleanup)
    drop = Drops()
    book = ProducerBook(
        ledger=ledger, terms=BookTerms.of(cfg), hostname=socket.gethostname(), clock=clock
    )
    places = Places(batches, spares, cfg.schema)
    stager_mels = cfg.features.device == "stager"
    cache_writer = None
    if stager_mels and cfg.features.cache:
        cache_writer = CacheWriter(cfg=cfg, n_places=cfg.spare_slots)
        cleanup.callback(cache_writer.close)
    assembly = Assembly(
        cfg=cfg,
        places=places,
        mel_fn=stager_mel_fn(cfg),
        ids=tables.item_ids(index),
        marked=outliers.delivered,
        cache_writer=cache_writer,
    )
    cleanup.callback(assembly.forget)  # and the places' views: before the rings unmap
    intake = Intake(
        places=places,
        ledger=ledger,
        book=book,
        schema=cfg.schema,
        drop=drop,
        audit_policy=AuditPolicy(cfg.ring.audit_fraction, cfg.ring.audit_first),
        vocab_size=cfg.vocab_size,
        audit_mel=NumpyLogMel(cfg) if stager_mels else None,
        cache_writer=cache_writer,
    )
    net = control_sockets(cfg, ends, spares, drop, book, cleanup, stop)
    delivery = Delivery(
        plan=plan,
        ledger=ledger,
        assembly=assembly,
        intake=intake,
        quarantine=quarantine,
        index=index,
        net=net,
        deterministic=cfg.stager.deterministic,
    )
    fingerprint = dict(plan.fingerprint)
    desk = ProducerDesk(
        book=book,
        intake=intake,
        welcome=p.Welcome(run_id, batches.name, index.n_items, fingerprint, spares.name),
        net=net,
        drop=drop,
        sample_config=config_fingerprint(cfg, corpus_digest(cfg, index)),
        on_join=functools.partial(settle_earlier, cfg, quarantine, index, ledger),
    )
    consumer = ConsumerSide(
        plan=plan,
        secret=write_consumer_secret(directory),
        welcome=p.Welcome(run_id, batches.name, index.n_items, fingerprint),
        book=book,
        delivery=delivery,
        ledger=ledger,
        net=net,
        drop=drop,
    )
    if cfg.lookahead_batches < cfg.lookahead_need and not cfg.ring.lookahead:
        log.warning(
            "the look-ahead is %d batches, not the %d the producers ask for: both rings must "
            "fit in %.0f%% of /dev/shm (%.0f MiB here); give the host more (docker run "
            "--shm-size) or set ring.lookahead",
            cfg.lookahead_batches,
            cfg.lookahead_need,
            100 * SHM_SHARE,
            shm_total_bytes() / 2**20,
        )
    log.info(
        "stager ready: %s (%d batch slots of %.2f MiB, %d batches ahead), %s (%d spare "
        "places), control %s",
        batches.name,
        cfg.batch_ring_slots,
        slot_bytes(batches.fields) / 2**20,
        cfg.lookahead_batches,
        spares.name,
        cfg.spare_slots,
        ends.control,
    )
    return Stager(
        cfg=cfg,
        run_id=run_id,
        stop=stop,
        index=index,
        plan=plan,
        net=net,
        drop=drop,
        ledger=ledger,
        book=book,
        assembly=assembly,
        delivery=delivery,
        producers=desk,
        consumer=consumer,
        outliers=outliers,
        gpus=GpuProbe(cfg),
        t_start=time.monotonic(),
        cache_writer=cache_writer,
    )


def control_sockets(
    cfg: Config,
    ends: Endpoints,
    spares: Ring,
    drop: Drops,
    book: ProducerBook,
    cleanup: contextlib.ExitStack,
    stop: StopFlag,
) -> ControlSockets:
    """The stager's sockets, bound: a remote frame at most a sample's largest field, or a
    remote READY's payload (shared/wire/bounds.py MAX_READY_PAYLOAD_BYTES); what does not
    decode is charged to its sender, and a banned remote peer is read no more."""
    largest = max(int(np.prod(shape)) * dtype.itemsize for shape, dtype in spares.fields.values())
    largest = max(largest, MAX_READY_PAYLOAD_BYTES)
    muted = functools.partial(drop, "banned-peer")  # a banned peer's message, unread
    with stop.held():  # its ipc socket files go with its close
        net = ControlSockets(cfg, ends, functools.partial(undecodable, drop, book), largest, muted)
        cleanup.callback(net.close)
    net.bans = book.trust.banned
    return net


def undecodable(drop: Drops, book: ProducerBook, why: str, ident: bytes, peer: PeerId) -> None:
    """A message that did not decode: dropped, counted, charged to whoever sent it (every
    MALFORMED_PER_STRIKE th a strike, consumer/stager/peers.py)."""
    drop("malformed", f"{why} (from {peer.ban})")
    if book.trust.undecodable(peer):
        book.strike(ident, f"{MALFORMED_PER_STRIKE} undecodable messages, the last: {why}", peer)


def outlier_report(
    cfg: Config,
    index: CorpusIndex,
    directory: Path,
    ledger: SlotLedger,
    cleanup: contextlib.ExitStack,
) -> OutlierReport:
    """data.outliers at start: the report (closed at cleanup), and the clips outside their
    speaking-rate band skipped before any grant or listed (consumer/stager/outliers.py)."""
    report = OutlierReport(cfg, directory, index)
    cleanup.callback(report.close)
    report.start(out_of_band_clips(cfg, index), ledger)
    return report


def slot_ledger(
    cfg: Config,
    plan: Plan,
    spares: Ring,
    batches: Ring,
    clock: RunClock,
    cleanup: contextlib.ExitStack,
) -> Ledger:
    """The slot ledger, writing into the rings' records until cleanup swaps in copies
    (before the rings are unmapped)."""
    records = PlaceRecords(batches.rows, spares.slots, batches.slots)
    ledger = Ledger(plan=plan, terms=LedgerTerms.of(cfg), clock=clock, records=records)
    cleanup.callback(lambda: ledger.attach(ledger.records.copy()))
    return ledger


def settle_earlier(
    cfg: Config,
    quarantine: QuarantineWriter,
    index: CorpusIndex,
    ledger: SlotLedger,
    causes: dict[str, str],
) -> None:
    """When the first producer of this start joins (causes: its HELLO's), before any
    grant: items quarantined earlier in this run (a restarted stager, a resumed run)
    for a cause that still holds are skipped without a try, as part of where a resumed
    run stands; those whose cause changed are tried again (consumer/stager/quarantine.py)."""
    if quarantine.settled:
        return
    skips, retried = quarantine.settle(index, causes)
    skips = earlier_skips(cfg, skips)  # an outlier's only under data.outliers: skip
    ledger.mark_bad(skips)
    if skips:
        log.info("%d items quarantined earlier in this run are skipped", len(skips))
    if retried:
        log.info(
            "%d items quarantined earlier in this run are tried again, their cause changed: %s",
            retried.total(),
            dict(retried),
        )


def main(cfg: Config, run_id: str, share: Share = ONE_WORKER) -> int:
    """Process entry of `ringfeed stager`: 0 when done, 2 for a configuration problem, 3
    when an epoch delivered nothing (the consumer is told why), 6 (STAGER_NO_CONSUMER)
    when no consumer was there for stager.consumer_wait_s. share: this host's
    worker of several (`--worker K/N`): it serves that share."""
    stop = StopFlag().install()
    try:
        with contextlib.ExitStack() as cleanup:
            with stop.raising():  # seconds on a busy host; it unwinds through cleanup
                stager = build(cfg, run_id, stop, cleanup, share)
            why = "stager stopping"
            try:
                stager.run()
                if stop.is_set():  # a signal, not the end of the plan: say so to the peers
                    name = signal.Signals(stop.signal).name if stop.signal else "its stop flag"
                    why = f"the run was stopped by {name}"
            except NothingDelivered as exc:
                log.error("%s", exc)
                why = str(exc)
                return 3
            except ConsumerGone as exc:
                log.error("%s", exc)
                why = str(exc)
                return STAGER_NO_CONSUMER
            except DiskFull as exc:  # the quarantine cannot say why an item is skipped
                why = f"the run stops: {exc}: free space there"
                log.error("%s", why)
                return 2
            finally:
                stager.finish(why)
    except Stopped as exc:  # a signal during the start: a stop like any other
        log.info("%s", exc)
    except (ConfigError, CorpusError) as exc:  # what to change, in one line
        log.error("config error: %s", exc)
        return 2
    except DiskFull as exc:  # at start: the quarantine's earlier lines settled
        log.error("the run stops: %s: free space there", exc)
        return 2
    return 0
