"""The stager: the data process (GPU:0 when features.device is stager).

It owns both rings and the plan. Main loop: poll messages, expire leases,
grant slots, move finished samples into batches, announce batches, publish
stats, check stop. Everything it decides is in consumer/slot_manager.py and
consumer/batch_builder.py; this file wires them to sockets and shared memory.

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
from typing import TYPE_CHECKING

import numpy as np

from consumer.batch_builder import BatchBuilder
from consumer.control import ControlSockets
from consumer.slot_manager import EpochPlan, Event, SlotManager
from producer.quarantine import QuarantineWriter
from producer.sources import make_source
from shared import protocol as p
from shared.config import Config, check_shm_fits, endpoints, run_dir
from shared.process import POLL_S, StopFlag, write_json_atomic
from shared.ring import Ring, SlotState, remove_stale_segments, segment_name

if TYPE_CHECKING:
    from consumer.gpu_mel import TfLogMel

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
LEASE_CHECK_S = 0.1


class Stager:
    def __init__(self, cfg: Config, run_id: str, stop: StopFlag) -> None:
        self.cfg, self.run_id, self.stop = cfg, run_id, stop
        self.dir = run_dir(cfg, run_id)
        self.endpoints = endpoints(cfg, run_id)
        self.dropped: Counter[str] = Counter()
        self.consumer: bytes | None = None
        self.peer_index: dict[bytes, int] = {}
        self.lengths: dict[int, list[int]] = {}
        self.batches_sent = 0
        self.turn = 0  # rotates which producer is granted first
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
        check_shm_fits(self.cfg)
        self.quarantine = QuarantineWriter(self.dir / "quarantine.jsonl")
        self.source = make_source(self.cfg, prepare=False)
        for bad in getattr(self.source, "bad_lines", []):
            self.quarantine.write(bad.item_id, f"{bad.file}:{bad.line}", bad.reason, "metadata")
        self.n_bad_lines = len(getattr(self.source, "bad_lines", []))
        log.info(
            "dataset: %d usable items, %d bad metadata lines (see %s)",
            self.source.n_items,
            self.n_bad_lines,
            self.dir / "quarantine.jsonl",
        )
        st, rc = self.cfg.stager, self.cfg.ring
        self.manager = SlotManager(
            EpochPlan(self.source.n_items, st.seed, st.epochs),
            rc.slots,
            rc.lease_s,
            rc.max_item_attempts,
            st.deterministic,
            socket.gethostname(),
            started=lambda k: self.samples.slots[k]["state"] == SlotState.WRITING,
        )
        self.fields = self.cfg.sample_fields()
        self.limits = [shape[0] for shape, _ in self.fields.values()]
        self.samples = Ring.create(
            segment_name(self.run_id, "samples"),
            self.fields,
            rc.slots,
            self.run_id,
            "samples",
            self.endpoints.stats,
        )
        self.batches = Ring.create(
            segment_name(self.run_id, "batches"),
            self.cfg.batch_fields(),
            st.batch_slots,
            self.run_id,
            "batches",
            self.endpoints.stats,
        )
        self.builder = BatchBuilder(self.cfg, self.batches, self._mel_fn())
        self.net = ControlSockets(self.cfg, self.endpoints, lambda why: self.drop("malformed", why))
        log.info(
            "stager ready: %s (%d x %.2f MiB slots), control %s",
            self.samples.name,
            rc.slots,
            self.cfg.sample_slot_bytes / 2**20,
            self.endpoints.control,
        )

    def _mel_fn(self) -> TfLogMel | None:
        """Batch log-mels on this process's device (features.device: stager), else None.

        Only this mode imports TensorFlow in the stager, after the device is chosen."""
        if self.cfg.features.device != "stager":
            return None
        from consumer.devices import choose_device, configure_tensorflow

        plan = choose_device("stager", self.cfg)
        from consumer.gpu_mel import TfLogMel

        configure_tensorflow(plan)
        return TfLogMel(self.cfg)

    # ------------------------------------------------------------ loop
    def run(self) -> None:
        next_lease = next_stats = 0.0
        while not self.stop.is_set() and not self.done:
            self.receive()
            now = time.monotonic()
            if now >= next_lease:
                for name in self.manager.expire():
                    log.warning(
                        "reclaimed the grants of %s (silent > %.1f s or dead)",
                        name,
                        self.cfg.ring.lease_s,
                    )
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

    def reply(self, ident: bytes, msg: p.Message) -> None:
        self.net.reply(ident, msg)

    def drop(self, why: str, detail: str) -> None:
        self.dropped[why] += 1
        if self.dropped[why] <= 3 or self.dropped[why] % 1000 == 0:
            log.warning("dropped a %s message (%d so far): %s", why, self.dropped[why], detail)

    def handle(self, ident: bytes, msg: p.Message, payload: list[bytes]) -> None:
        producer = self.manager.touch(ident)
        if producer is not None and producer.stalled and not isinstance(msg, p.Hello):
            self.reply(ident, p.Rehello())  # its queued grants are void: start over
        if isinstance(msg, p.Hello) and not 0 < msg.pid < 2**31:
            self.drop("malformed", f"HELLO with pid {msg.pid}")
        elif isinstance(msg, p.Hello):
            self.manager.hello(ident, msg.name, msg.pid, msg.host, msg.remote)
            self.peer_index.setdefault(ident, len(self.peer_index))
            log.info(
                "producer %s joined (pid %d on %s%s)",
                msg.name,
                msg.pid,
                msg.host,
                ", remote" if msg.remote else "",
            )
            self.reply(ident, p.Welcome(self.run_id, self.samples.name, self.source.n_items))
        elif isinstance(msg, p.ConsumerHello):
            self.consumer_hello(ident, msg)
        elif ident == self.consumer:
            self.consumer_message(ident, msg)
        elif producer is None:
            self.drop("unknown-peer", f"{type(msg).__name__} from a peer that never said HELLO")
            self.reply(ident, p.Rehello())  # a producer of a previous stager
        elif isinstance(msg, p.Request):
            self.credit(producer, msg.credits)
        elif isinstance(msg, p.Ready):
            self.ready(ident, msg, payload)
        elif isinstance(msg, p.Skip):
            self.credit(producer, 1)
            if self.manager.skip(ident, msg.slot, msg.generation, msg.item, msg.reason):
                self.samples.slots[msg.slot]["state"] = SlotState.FREE
                self.quarantine.write(
                    self.source.item_id(msg.item), msg.path, msg.reason, "producer"
                )
            else:
                self.drop("stale", f"SKIP of slot {msg.slot} generation {msg.generation}")
        elif isinstance(msg, p.Heartbeat):
            # Plain counters only: the inspector does arithmetic on what a peer sent.
            producer.work = {k: v for k, v in list(msg.work.items())[:16] if type(v) is int}
            self.reply(ident, p.Heartbeat(0, {}))
        elif isinstance(msg, p.Crash):
            log.error("producer %s crashed:\n%s", msg.name, msg.traceback)
            self.crashes.append({"name": msg.name, "traceback": msg.traceback[-2000:]})
        elif isinstance(msg, p.Bye):
            self.manager.drop_producer(ident, charge=False)
            self.reply(ident, p.ByeAck())
        else:
            self.drop("unexpected", f"{type(msg).__name__} from producer {producer.name}")

    def credit(self, producer, n: int) -> None:
        """More grants the producer asks for, never above producers.credits."""
        producer.credits = min(producer.credits + max(0, n), self.cfg.producers.credits)

    def share(self) -> int:
        """Most grants one producer may hold, so none holds the slots the others need."""
        fair = (self.cfg.ring.slots - 1) // max(1, len(self.manager.producers))
        return max(1, min(self.cfg.producers.credits, fair))

    def ready(self, ident: bytes, msg: p.Ready, payload: list[bytes]) -> None:
        """Accept each filled slot of a READY that its producer still owns."""
        n, k = len(msg.slots), len(self.fields)
        if not (len(msg.generations) == len(msg.items) == len(msg.checksums) == n) or (
            len(msg.truncated) != n or len(msg.lengths) != n * k
        ):
            self.drop("malformed", f"READY with inconsistent list sizes ({n} slots)")
            return
        producer = self.manager.producers[ident]
        self.credit(producer, n)  # each entry asks for the next grant
        if producer.remote and (n != 1 or not self.copy_payload(msg, payload, ident)):
            if n != 1:
                self.drop("malformed", f"remote READY with {n} entries, need 1 with payload")
            return
        for i in range(n):
            lengths = msg.lengths[i * k : (i + 1) * k]
            self.accept(
                ident,
                producer.remote,
                msg.slots[i],
                msg.generations[i],
                msg.items[i],
                lengths,
                msg.checksums[i],
            )

    def valid_lengths(self, lengths: list[int]) -> bool:
        return all(0 < n <= lim for n, lim in zip(lengths, self.limits, strict=True))

    def accept(
        self,
        ident: bytes,
        remote: bool,
        slot: int,
        generation: int,
        item: int,
        lengths: list[int],
        checksum: int,
    ) -> None:
        if not self.valid_lengths(lengths):
            self.drop("malformed", f"READY lengths {lengths} outside {self.limits}")
            return
        if not self.manager.owns(ident, slot, generation, item):
            self.drop("stale", f"READY of slot {slot} generation {generation}")
            return
        header = self.samples.slots[slot]
        if not remote and int(header["sealed_generation"]) != generation:
            self.drop("unsealed", f"slot {slot} is not sealed with generation {generation}")
            return
        if self.cfg.ring.checksum and not remote:
            used = dict(zip(self.fields, lengths, strict=True))
            if self.samples.checksum(slot, used) != checksum:
                self.drop("checksum", f"slot {slot} item {item}")
                return
        self.manager.ready(ident, slot, generation, item)
        self.lengths[slot] = lengths
        header["state"] = SlotState.READY

    def copy_payload(self, msg: p.Ready, payload: list[bytes], ident: bytes) -> bool:
        """Check a remote READY's raw frames against its granted slot and copy them in."""
        slot, lengths = msg.slots[0], msg.lengths
        if len(payload) != len(self.fields) or not self.valid_lengths(lengths):
            self.drop("malformed", f"remote READY: {len(payload)} frames, lengths {lengths}")
            return False
        if not self.manager.owns(ident, slot, msg.generations[0], msg.items[0]):
            self.drop("stale", f"remote READY of slot {slot} generation {msg.generations[0]}")
            return False
        for (name, (shape, dtype)), n, frame in zip(
            self.fields.items(), lengths, payload, strict=True
        ):
            row_bytes = int(np.prod(shape[1:])) * dtype.itemsize
            if len(frame) != n * row_bytes:
                self.drop("malformed", f"{name} frame of {len(frame)} bytes, need {n * row_bytes}")
                return False
        for name, n, frame in zip(self.fields, lengths, payload, strict=True):
            dst = self.samples.view(name)[slot]
            dst[:n] = np.frombuffer(frame, dtype=dst.dtype).reshape(dst[:n].shape)
            dst[n:] = 0
        return True

    def consumer_hello(self, ident: bytes, msg: p.ConsumerHello) -> None:
        if self.consumer is not None:
            log.warning(
                "consumer %s replaces the previous one: restarting the plan at %d",
                msg.name,
                msg.position,
            )
        self.consumer = ident
        self.manager.reset(msg.position)
        for k, slot in enumerate(self.manager.slots):
            self.samples.slots[k]["state"] = slot.state
        self.builder.reset()
        self.batches_sent, self.end_sent = msg.batch_index, False
        log.info(
            "consumer %s starts at plan position %d (epoch %d), batch %d",
            msg.name,
            msg.position,
            self.manager.plan.epoch_of(msg.position),
            msg.batch_index,
        )
        self.reply(ident, p.Welcome(self.run_id, self.batches.name, self.source.n_items))

    def consumer_message(self, ident: bytes, msg: p.Message) -> None:
        if isinstance(msg, p.BatchFree):
            if not self.builder.free(msg.slot, msg.generation):
                self.drop("stale", f"BATCH_FREE of slot {msg.slot} generation {msg.generation}")
        elif isinstance(msg, p.StepStats):
            self.trainer = {
                "step": msg.step,
                "step_s": msg.step_s,
                "wait_s": msg.wait_s,
                "loss": msg.loss,
                "t": time.time(),
            }
        elif isinstance(msg, p.Bye):
            log.info("consumer finished after %d batches; stopping the run", self.batches_sent)
            self.done = True
            self.reply(ident, p.ByeAck())
        else:
            self.drop("unexpected", f"{type(msg).__name__} from the consumer")

    # ------------------------------------------------------------ grant and deliver
    def grant(self) -> None:
        """Give each producer what its credits allow, in one GRANT message per producer."""
        if self.consumer is None:
            return  # the consumer's cursor says where the plan starts
        order = list(self.manager.producers.items())
        if not order:
            return
        self.turn = (self.turn + 1) % len(order)
        share = self.share()
        for ident, producer in order[self.turn :] + order[: self.turn]:
            grants = []
            while len(producer.slots) < share and (g := self.manager.grant(ident)) is not None:
                grants.append(g)
                slot, generation, item, position = g
                h = self.samples.slots[slot]
                h["state"], h["generation"], h["item"] = SlotState.GRANTED, generation, item
                h["epoch"] = self.manager.plan.epoch_of(position)
                h["producer"], h["t_granted"] = self.peer_index[ident], time.time()
            if grants:
                self.reply(ident, p.Grant(*map(list, zip(*grants, strict=True))))

    def deliver(self) -> None:
        if self.consumer is None:
            return
        while True:
            room = self.builder.room()
            events = self.manager.pop_events(room)
            for event in events:
                if event.kind == "sample":
                    self.take(event)
            if self.builder.full():
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

    def take(self, event: Event) -> None:
        self.builder.add(self.samples, event.slot, event.item, self.lengths.pop(event.slot))
        self.manager.release(event.slot)
        self.samples.slots[event.slot]["state"] = SlotState.FREE

    def announce(self) -> None:
        slot, generation, n_valid = self.builder.finish()
        position = self.manager.cursor
        msg = p.BatchReady(
            slot,
            generation,
            self.batches_sent,
            position,
            self.manager.plan.epoch_of(max(0, position - 1)),
            n_valid,
        )
        self.reply(self.consumer, msg)
        self.batches_sent += 1

    # ------------------------------------------------------------ stats and teardown
    def snapshot(self) -> dict:
        """Everything the inspector and stager.json show; plain data."""
        now = time.monotonic()
        states = Counter(SlotState(s.state).name for s in self.manager.slots)
        producers = [
            {
                "name": pr.name,
                "pid": pr.pid,
                "host": pr.host,
                "remote": pr.remote,
                "samples": pr.samples,
                "grants": len(pr.slots),
                "fenced": len(pr.fenced),
                "silent_s": round(now - pr.last_seen, 3),
                "stalled": pr.stalled,
                "work": pr.work,
            }
            for pr in self.manager.producers.values()
        ]
        return {
            "run_id": self.run_id,
            "uptime_s": round(now - self.t_start, 3),
            "n_items": self.source.n_items,
            "cursor": self.manager.cursor,
            "epoch": self.manager.plan.epoch_of(self.manager.cursor),
            "slots": dict(states),
            "n_slots": self.cfg.ring.slots,
            "batch_slots_ready": self.builder.in_flight(),
            "batches": self.batches_sent,
            "counters": dict(self.manager.counters),
            "dropped": dict(self.dropped),
            "bad_metadata_lines": self.n_bad_lines,
            "producers": producers,
            "crashes": list(self.crashes),
            "trainer": self.trainer,
            "consumer_connected": self.consumer is not None,
            "refused_producers": self.net.refused if self.net is not None else 0,
        }

    def publish(self) -> None:
        self.net.publish(p.Stats(self.snapshot()))

    def teardown(self) -> None:
        """Stop peers, record the run, unlink the segments; safe after a partial setup."""
        if self.net is not None:
            for ident in list(self.manager.producers):
                self.reply(ident, p.Shutdown("run finished"))
            if self.consumer is not None and not self.done:
                self.reply(self.consumer, p.Shutdown("stager stopping"))
            write_json_atomic(self.dir / "stager.json", self.snapshot())
            time.sleep(POLL_S)  # let the SHUTDOWNs leave; leases cover a lost one
        if self.net is not None:
            self.net.close()
        if self.quarantine is not None:
            self.quarantine.close()
        for ring in (self.samples, self.batches):
            if ring is not None:
                ring.close()
                ring.unlink()
        if self.manager is not None:
            log.info("stager done: %s", json.dumps(self.manager.counters))


def main(cfg: Config, run_id: str) -> int:
    """Process entry of `ringfeed stager`."""
    stop = StopFlag().install()
    stager = Stager(cfg, run_id, stop)
    try:
        stager.setup()
        stager.run()
    finally:
        stager.teardown()
    return 0
