"""The stager: the data process (GPU:0 when features.device is stager).

It owns both rings and the plan. Main loop: poll messages, expire leases,
grant slots, move finished samples into batches, announce batches, publish
stats, check stop. Everything it decides is in consumer/stager/slot_manager.py and
consumer/stager/batch_builder.py; this file wires them to sockets and shared memory.
Each message kind has one short handler, found in a table (:attr:`Stager.HANDLERS`).

A malformed, oversized or stale message is dropped and counted, never fatal.
On exit (stop flag, SIGTERM, or the consumer's BYE) it tells producers to
stop, writes stager.json into the run directory, and unlinks both segments.
"""

from __future__ import annotations

import collections
import json
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from consumer.devices import count_gpus_for, stager_mel_fn
from consumer.stager.batch_builder import BatchBuilder
from consumer.stager.buckets import Bucket, BucketPlan, length_manifest, make_buckets
from consumer.stager.consumer_side import ConsumerSide
from consumer.stager.control import ControlSockets, is_remote
from consumer.stager.intake import Intake
from consumer.stager.plan import EpochPlan, Event
from consumer.stager.ready import (
    row_limits,
)
from consumer.stager.slot_manager import SlotManager
from consumer.stager.state import Producer
from consumer.stager.stats import MAX_WORK, MAX_WORK_KEY, snapshot
from shared import protocol as p
from shared.config import Config, ConfigError, endpoints, ensure_runtime_dir, run_dir
from shared.dataset import DatasetError, dataset_index
from shared.process import POLL_S, StopFlag, write_json_atomic
from shared.quarantine import QuarantineWriter
from shared.ring import Ring, check_shm_fits, segment_name, slot_bytes
from shared.run_secret import write_consumer_secret
from shared.segments import remove_stale_segments

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
LEASE_CHECK_S = 0.1
# At the end, how long the stager waits for producers' goodbyes (their final counters).
LAST_WORDS_S = 1.0


def take_work(producer: Producer, work: dict[str, Any]) -> None:
    """Keep a producer's reported counters: plain ints only (the inspector does arithmetic
    on what a peer sent), at most MAX_WORK of them."""
    kept = [(k, v) for k, v in work.items() if type(v) is int and len(k) <= MAX_WORK_KEY]
    producer.work = dict(kept[:MAX_WORK])


class Stager(ConsumerSide, Intake):
    def __init__(self, cfg: Config, run_id: str, stop: StopFlag) -> None:
        self.cfg, self.run_id, self.stop = cfg, run_id, stop
        self.dir = run_dir(cfg, run_id)
        self.endpoints = endpoints(cfg, run_id)
        self.dropped: Counter[str] = Counter()
        self.consumer: bytes | None = None
        self.consumer_at = (-1, -1)  # the (position, batch_index) its hello asked for
        # slot -> (true lengths, checksum) of the READY accepted for it, checked at copy.
        self.accepted: dict[int, tuple[list[int], int]] = {}
        self.buckets: list[Bucket] = []  # empty: one fixed batch shape
        self.batches_sent = 0
        self.first_position = self.last_position = 0  # of the batch being built
        self.end_sent = False
        self.done = False
        self.trainer: dict = {}
        self.crashes: collections.deque[dict] = collections.deque(maxlen=5)
        self.t_start = time.monotonic()
        self.net: ControlSockets | None = None
        self.samples: Ring | None = None
        self.batches: Ring | None = None
        self.quarantine: QuarantineWriter | None = None
        self.manager: SlotManager | None = None

    # ------------------------------------------------------------ setup
    def setup(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.yaml").write_text(self.cfg.to_yaml())
        remove_stale_segments()
        ensure_runtime_dir()  # 0700: the ipc sockets are this user's only
        check_shm_fits(self.cfg)
        self.quarantine = QuarantineWriter(self.dir / "quarantine.jsonl")
        self.index = dataset_index(self.cfg)
        for bad in self.index.bad_lines:
            self.quarantine.write(bad.item_id, f"{bad.file}:{bad.line}", bad.reason, "metadata")
        log.info(
            "dataset: %d usable items, %d bad metadata lines (see %s)",
            self.index.n_items,
            len(self.index.bad_lines),
            self.dir / "quarantine.jsonl",
        )
        st, rc = self.cfg.stager, self.cfg.ring
        self.fields = self.cfg.sample_fields()
        self.limits = row_limits(self.fields)
        name, stats = segment_name(self.run_id, "samples"), self.endpoints.stats
        self.samples = Ring.create(name, self.fields, rc.slots, self.run_id, "samples", stats)
        name, fields = segment_name(self.run_id, "batches"), self.cfg.batch_ring_fields()
        self.batches = Ring.create(name, fields, st.batch_slots, self.run_id, "batches", stats)
        # Producers' progress fields, read per READY and per copy (column views: cheap).
        self.seals = self.samples.slots["sealed_generation"]
        self.writing = self.samples.slots["writing_generation"]
        self.secret = write_consumer_secret(self.dir)
        self.manager = SlotManager(
            self.make_plan(),
            rc.slots,
            rc.lease_s,
            rc.max_item_attempts,
            st.deterministic,
            socket.gethostname(),
            started=self._started,
            headers=self.samples.slots,
            max_credits=self.cfg.producers.credits,
        )
        # Items quarantined earlier in this run (a restarted stager, a resumed run) are
        # skipped without a try: the skips are part of where a resumed run stands.
        self.manager.known_bad.update(self.quarantine.earlier_skips(self.index))
        if self.manager.known_bad:
            log.info("%d items quarantined earlier in this run are skipped",
                     len(self.manager.known_bad))  # fmt: skip
        self.gpus = count_gpus_for(self.cfg)  # the inspector's advice depends on it
        self.builder = BatchBuilder(self.cfg, self.batches, stager_mel_fn(self.cfg))
        largest = max(int(np.prod(shape)) * dtype.itemsize for shape, dtype in self.fields.values())
        on_malformed = lambda why: self.drop("malformed", why)  # noqa: E731
        self.net = ControlSockets(self.cfg, self.endpoints, on_malformed, largest)
        log.info(
            "stager ready: %s (%d x %.2f MiB slots), control %s",
            self.samples.name,
            rc.slots,
            slot_bytes(self.fields) / 2**20,
            self.endpoints.control,
        )

    def make_plan(self) -> EpochPlan:
        """The epoch plan; with length buckets, one that also says which batch each
        position belongs to (consumer/stager/buckets.py)."""
        st = self.cfg.stager
        if not st.bucketed:
            return EpochPlan(self.index.n_items, st.seed, st.epochs)
        config_file = self.dir / "config.yaml"
        manifest = length_manifest(self.cfg, self.index, config_file, self.stop.is_set)
        self.buckets, of_item = make_buckets(self.cfg, manifest)
        counts = np.bincount(of_item, minlength=len(self.buckets))
        log.info("length buckets: %s", ", ".join(
            f"{b.frames} frames x {b.rows} rows, text {b.text} ({n} items)"
            for b, n in zip(self.buckets, counts, strict=True)))  # fmt: skip
        return BucketPlan(st.seed, st.epochs, self.buckets, of_item, manifest.text)

    def _started(self, k: int) -> bool:
        """Was the local producer holding slot k in the middle of its current grant: begun,
        not sealed? (A sealed one whose READY had not left yet did not fail.)"""
        h, generation = self.samples.slots[k], self.manager.slots[k].generation
        return int(h["writing_generation"]) == generation != int(h["sealed_generation"])

    # ------------------------------------------------------------ loop
    def run(self) -> None:
        next_lease = next_stats = 0.0
        while not self.stop.is_set() and not self.done:
            self.receive()
            now = time.monotonic()
            if now >= next_lease:
                for name in self.manager.expire():
                    log.warning("took back grants of %s: no READY within ring.lease_s=%.1f s"
                                " (or its process died)", name, self.cfg.ring.lease_s)  # fmt: skip
                self.manager.reap_zombies()
                next_lease = now + LEASE_CHECK_S
            self.grant()
            self.deliver()
            if now >= next_stats:
                self.publish()
                next_stats = now + STATS_INTERVAL_S

    def receive(self) -> None:
        for ident, msg, payload in self.net.receive(POLL_S):
            self.handle(ident, msg, payload)

    def reply(self, ident: bytes, msg: p.Message) -> bool:
        """Send without blocking; False if the peer is gone or its queue is full."""
        return self.net.reply(ident, msg)

    def drop(self, why: str, detail: str) -> None:
        self.dropped[why] += 1
        if self.dropped[why] <= 3 or self.dropped[why] % 1000 == 0:
            log.warning("dropped a %s message (%d so far): %s", why, self.dropped[why], detail)

    def handle(self, ident: bytes, msg: p.Message, payload: list[bytes]) -> None:
        """Route one message: hellos and the consumer's messages first, then a known
        producer's by kind; anything else is dropped and counted."""
        producer = self.manager.touch(ident)
        if producer is not None and producer.stalled and not isinstance(msg, p.Hello):
            self.reply(ident, p.Rehello())  # its queued grants are void: start over
        if isinstance(msg, p.ConsumerHello):
            self.consumer_hello(ident, msg)
        elif ident == self.consumer and not isinstance(msg, p.Hello):
            self.dispatch(self.CONSUMER_HANDLERS, "the consumer", msg, ident)
        elif isinstance(msg, p.Hello):
            self.hello(ident, msg)
        elif producer is None:
            self.drop("unknown-peer", f"{type(msg).__name__} from a peer that never said HELLO")
            self.reply(ident, p.Rehello())  # a producer of a previous stager
        else:
            self.dispatch(self.HANDLERS, f"producer {producer.name}", msg, producer, payload)

    def dispatch(self, table: dict[type, Callable], sender: str, msg: p.Message, *args) -> None:
        handler = table.get(type(msg))
        if handler is None:
            self.drop("unexpected", f"{type(msg).__name__} from {sender}")
        else:
            handler(self, msg, *args)

    def hello(self, ident: bytes, msg: p.Hello) -> None:
        if not 0 < msg.pid < 2**31:
            self.drop("malformed", f"HELLO with pid {msg.pid}")
            return
        why = self.manager.refusal(ident, msg.name, msg.token)
        if why:
            self.drop("refused-hello", why)  # it says HELLO again after a lease
            return
        # A peer on the tcp socket is remote whatever it says: it never writes our memory.
        remote = msg.remote or is_remote(ident)
        self.manager.hello(ident, msg.name, msg.pid, msg.host, remote, msg.token)
        self.manager.producers[ident].place = msg.place
        remote = ", remote" if remote else ""
        log.info("producer %s joined (pid %d on %s%s)", msg.name, msg.pid, msg.host, remote)
        self.reply(ident, p.Welcome(self.run_id, self.samples.name, self.index.n_items))

    def on_request(self, msg: p.Request, producer: Producer, payload: list[bytes]) -> None:
        self.manager.credit(producer.ident, msg.credits)

    def on_skip(self, msg: p.Skip, producer: Producer, payload: list[bytes]) -> None:
        self.manager.credit(producer.ident, 1)
        ok = self.manager.skip(
            producer.ident, msg.slot, msg.generation, msg.item, msg.reason, msg.stage, msg.path
        )
        if not ok:
            self.drop("stale", f"SKIP of slot {msg.slot} generation {msg.generation}")

    def on_heartbeat(self, msg: p.Heartbeat, producer: Producer, payload: list[bytes]) -> None:
        take_work(producer, msg.work)
        self.reply(producer.ident, p.Heartbeat(0, {}))

    def on_crash(self, msg: p.Crash, producer: Producer, payload: list[bytes]) -> None:
        log.error("producer %s crashed:\n%s", msg.name, msg.traceback)
        self.crashes.append({"name": msg.name, "traceback": msg.traceback[-2000:]})

    def on_bye(self, msg: p.Bye, producer: Producer, payload: list[bytes]) -> None:
        self.manager.drop_producer(producer.ident, charge=False)
        self.reply(producer.ident, p.ByeAck())

    HANDLERS: dict[type, Callable[..., None]] = {
        p.Request: on_request,
        p.Ready: Intake.on_ready,
        p.Skip: on_skip,
        p.Heartbeat: on_heartbeat,
        p.Crash: on_crash,
        p.Bye: on_bye,
    }

    # ------------------------------------------------------------ grant and deliver
    def grant(self) -> None:
        """Give each producer what its credits allow, in one GRANT message per producer."""
        if self.consumer is None:
            return  # the consumer's cursor says where the plan starts
        for ident, grants in self.manager.grant_round().items():
            if not self.reply(ident, p.Grant(*map(list, zip(*grants, strict=True)))):
                self.drop("unsent", f"GRANT of {len(grants)} slots: the peer is gone or full")
                self.manager.unsend(ident, [g[0] for g in grants])

    def deliver(self) -> None:
        if self.consumer is None:
            return
        while True:
            room, until = self.builder.room(), None
            if room and self.buckets:  # a batch is a range of plan positions
                until = self.begin_batch()
            events = self.manager.pop_events(room, until)
            for i, event in enumerate(events):
                if event.kind == "skip":
                    self.record_skip(event)
                elif not self.take(event):
                    self.manager.torn(events[i:])  # re-granted; the rest wait their turn
                    break
            if self.builder.full() or (until is not None and self.manager.cursor >= until):
                if self.builder.rows:  # a batch whose items were all skipped is not sent
                    self.announce()
                continue
            if not events:
                break
        if self.manager.exhausted() and not self.end_sent:
            if self.builder.partial():
                self.announce()
            if not self.builder.partial():
                self.reply(self.consumer, p.EndOfData(self.batches_sent))
                self.end_sent = True

    def begin_batch(self) -> int:
        """Length buckets: give the batch starting at the cursor its bucket's shape;
        returns the position after its last."""
        bucket, _, end = self.manager.plan.batch_at(self.manager.cursor)
        if self.builder.rows == 0:
            self.builder.begin(self.buckets[bucket].shape)
        return end

    def record_skip(self, event: Event) -> None:
        """One quarantine line per skipped item per run, whoever gave up on it."""
        path = event.path or self.index.path(event.item)
        item_id = self.index.item_id(event.item)
        if self.quarantine.write(item_id, path, event.reason, event.stage):
            log.warning("skipped %s (%s): %s", item_id, event.stage, event.reason)

    def announce(self) -> None:
        slot, generation, n_valid = self.builder.finish()
        epoch_of = self.manager.plan.epoch_of
        msg = p.BatchReady(
            slot,
            generation,
            self.batches_sent,
            self.manager.cursor,
            epoch_of(self.last_position),
            n_valid,
            epoch_of(self.first_position),
            *self.builder.shape,
        )
        self.reply(self.consumer, msg)
        self.batches_sent += 1

    # ------------------------------------------------------------ stats and teardown
    def publish(self) -> None:
        self.net.publish(p.Stats(snapshot(self).to_dict()))

    def last_reports(self) -> None:
        """After SHUTDOWN: read producers' reports until each has said BYE, which carries
        its final counters, or LAST_WORDS_S passed (a dead or cut-off producer), so
        stager.json holds every producer's last counters however short the run was.
        Only reports are acted on now; each BYE is acknowledged."""
        waiting = set(self.manager.producers)
        deadline = time.monotonic() + LAST_WORDS_S
        while waiting and time.monotonic() < deadline:
            for ident, msg, payload in self.net.receive(POLL_S):
                producer = self.manager.producers.get(ident)
                if producer is None or not isinstance(msg, p.Heartbeat | p.Crash | p.Bye):
                    continue
                if isinstance(msg, p.Bye):
                    take_work(producer, msg.work)
                    waiting.discard(ident)
                    self.reply(ident, p.ByeAck())
                else:
                    self.dispatch(
                        self.HANDLERS, f"producer {producer.name}", msg, producer, payload
                    )

    def teardown(self) -> None:
        """Stop peers, record the run, unlink the segments; safe after a partial setup."""
        if self.net is not None:
            if self.consumer is not None and not self.done:
                self.reply(self.consumer, p.Shutdown("stager stopping"))
            if self.manager is not None:
                for ident in list(self.manager.producers):
                    self.reply(ident, p.Shutdown("run finished"))
                self.last_reports()
            write_json_atomic(self.dir / "stager.json", snapshot(self).to_dict())
            time.sleep(POLL_S)  # let the SHUTDOWNs leave; leases cover a lost one
        if self.net is not None:
            self.net.close()
        if self.quarantine is not None:
            self.quarantine.close()
        if self.manager is not None:
            self.manager.attach_headers(self.manager.headers.copy())  # no view outlives the map
        self.seals = self.writing = None
        for ring in (self.samples, self.batches):
            if ring is not None:
                ring.close()
                ring.unlink()
        if self.manager is not None:
            log.info("stager done: %s", json.dumps(self.manager.counters))


def main(cfg: Config, run_id: str) -> int:
    """Process entry of `ringfeed stager`: 0 when done, 2 for a configuration problem."""
    stop = StopFlag().install()
    stager = Stager(cfg, run_id, stop)
    try:
        stager.setup()
        stager.run()
    except (ConfigError, DatasetError) as exc:  # what to change, in one line
        log.error("config error: %s", exc)
        return 2
    finally:
        stager.teardown()
    return 0
