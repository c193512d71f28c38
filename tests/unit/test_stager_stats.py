"""The stager's stats: each part reports its own record, and the stager composes them
into the one record of the stats stream and stager.json, whose keys users read as plain
JSON. Without processes; the worst case of the composed message is in
tests/unit/test_peer_output.py, real runs' stager.json in the process tests."""

from __future__ import annotations

import json
import os

from ringfeed.consumer.stager.batch_builder import BatchBuilder
from ringfeed.consumer.stager.drops import Drops
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from ringfeed.consumer.stager.producer_book import FORGET_LEASES, ProducerBook
from ringfeed.consumer.stager.slot_manager import SlotManager
from ringfeed.producer.sources import SyntheticSource
from ringfeed.shared.config import Config, replace
from ringfeed.shared.memory.ring import Ring, segment_name
from ringfeed.shared.run.stats_record import (
    MAX_LISTED_PRODUCERS,
    BookStats,
    BuilderStats,
    ConsumerStats,
    ControlStats,
    CrashReport,
    DeliveryStats,
    DeskStats,
    DropStats,
    Padding,
    ProducerStats,
    RunStats,
    SlotStats,
    StagerStats,
    TrainerReport,
    UnlistedProducers,
)
from ringfeed.shared.wire import protocol as p
from tests.support.runs import rid

HOST = "this-host"
PEER = PeerId("pool 1", "uid 0 pid 1")

# What stager.json and the stats stream hold, in order: users, scripts and the
# inspector read these keys as plain JSON.
STAGER_JSON_KEYS = [
    "run_id", "uptime_s", "n_items", "cursor", "epoch", "slots", "n_slots",
    "batch_slots_ready", "batches", "padding_efficiency", "buckets", "counters",
    "dropped", "bad_metadata_lines", "producers", "producers_unlisted", "crashes",
    "trainer", "consumer_connected", "refused_producers", "gpus", "features_device",
    "lease_s", "outliers", "skipped_by_stage", "quarantined_by_stage",
]  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def book_of(n_items: int, n_slots: int, clock: Clock) -> ProducerBook:
    """A producer book over its slot manager, as the stager builds them."""
    plan = Plan(Shuffle(n_items, seed=7), epochs=2)
    slots = SlotManager(plan, n_slots, lease_s=5.0, max_attempts=3, deterministic=True,
                        clock=clock)  # fmt: skip
    return ProducerBook(slots, HOST, max_credits=16, max_strikes=3, max_per_peer=64)


def join(
    book: ProducerBook, name: str, samples: int = 0, token: str = "", ident: bytes = b""
) -> bytes:
    """name joins under `ident` (default: the name) as the process `token` (default: the
    name)."""
    ident = ident or name.encode()
    hello = p.Hello(name, os.getpid(), HOST, False, token=token or name, place="", config={})
    book.hello(ident, hello, remote=False, peer=PEER)
    book.producers[ident].credits, book.producers[ident].samples = 16, samples
    return ident


def test_the_slot_manager_reports_its_cursor_its_epoch_and_its_slots() -> None:
    book = book_of(n_items=3, n_slots=4, clock=Clock())
    ident = join(book, "a")
    grants = [book.grant(ident) for _ in range(3)]  # positions 0, 1, 2: all of epoch 0
    slot, generation, item, _ = grants[0]
    assert book.slots.ready(ident, slot, generation, item)
    s = book.slots.stats()
    assert (s.cursor, s.epoch, s.n_slots) == (0, 0, 4)
    assert s.states == {"FREE": 1, "GRANTED": 2, "READY": 1}
    assert (s.counters["grants"], s.counters["ready"], s.counters["delivered"]) == (3, 1, 0)
    for slot, generation, item, _ in grants[1:]:
        assert book.slots.ready(ident, slot, generation, item)
    for event in book.slots.pop_events(10):
        book.slots.release(event.slot)
    s = book.slots.stats()
    assert (s.cursor, s.epoch, s.states, s.counters["delivered"]) == (3, 1, {"FREE": 4}, 3)


def test_the_book_lists_working_producers_first_and_sums_the_rest() -> None:
    clock = Clock()
    book = book_of(n_items=100, n_slots=8, clock=clock)
    names = [f"p{i:02d}" for i in range(MAX_LISTED_PRODUCERS + 3)]
    for i, name in enumerate(names):
        join(book, name, samples=i)
    assert book.grant(b"p00") is not None  # the one working producer
    book.producers[b"p01"].stalled = True  # must say HELLO again: listed last
    clock.t = 2.5
    s = book.stats()
    idle = [n for n in reversed(names) if n not in ("p00", "p01")]  # by samples
    shown = ["p00", *idle][:MAX_LISTED_PRODUCERS]
    assert [row.name for row in s.producers] == shown
    first = s.producers[0]
    assert (first.grants, first.fenced, first.silent_s, first.host) == (1, 0, 2.5, HOST)
    rest = [names.index(n) for n in names if n not in shown]
    assert s.unlisted == UnlistedProducers(count=len(rest), samples=sum(rest), grants=0)
    zero = {"restarts": 0, "pauses": 0, "forgotten": 0, "strikes": 0, "peers_banned": 0}
    assert s.counters == {"joined": len(names)} | zero
    book.strike(b"p02", "lied")
    join(book, "p03", token="new")  # the same name from another process: a restart
    join(book, "p04", ident=b"p04-2")  # the same process on a new socket: neither
    expected = zero | {"joined": len(names) + 2, "restarts": 1, "strikes": 1}
    assert book.stats().counters == expected


def test_a_producer_given_up_for_its_silence_that_comes_back_is_a_pause_not_a_restart() -> None:
    """SIGSTOPped past the leases the stager waits before forgetting it: its HELLO from
    the same process is a pause, and what it sent on its old socket is no unknown peer's
    (was_forgotten names it, for the stager's "late" count)."""
    clock = Clock()
    book = book_of(n_items=100, n_slots=8, clock=clock)
    join(book, "p0")
    join(book, "p1")
    clock.t = (FORGET_LEASES + 1) * book.lease_s
    book.touch(b"p1")  # p1 kept talking
    book.expire()
    assert b"p0" not in book.producers and book.was_forgotten(b"p0") == "p0"
    assert book.was_forgotten(b"p1") == ""
    join(book, "p0", ident=b"p0-2")
    join(book, "p1", ident=b"p1-2")  # the same process again while talking: no pause
    counters = book.stats().counters
    assert (counters["pauses"], counters["restarts"], counters["forgotten"]) == (1, 0, 1)
    assert counters["joined"] == 4


def test_the_builder_reports_batches_in_flight_and_their_padding() -> None:
    cfg = replace(Config(), data={"format": "synthetic", "synthetic_items": 40},
                  features={"max_frames": 32}, text={"max_text_len": 32},
                  stager={"batch_size": 4})  # fmt: skip
    source, run_id = SyntheticSource(cfg), rid()
    with (
        Ring.create(segment_name(run_id, "samples"), cfg.sample_fields(), 2, run_id,
                    "samples") as samples,
        Ring.create(segment_name(run_id, "batches"), cfg.batch_ring_fields(), 1, run_id,
                    "batches") as batches,
    ):  # fmt: skip
        builder = BatchBuilder(cfg, batches, None)
        assert builder.stats() == BuilderStats(0, Padding(None, None))  # no batch yet
        builder.room()
        frames = text = 0
        for k, item in enumerate([3, 17]):
            sample = source.prepare(item)
            lengths = []
            for name in samples.fields:
                x = sample.array(name)
                samples.view(name)[k][: len(x)] = x
                lengths.append(len(x))
            builder.add(samples, k, item, lengths, position=k)
            text, frames = text + lengths[0], frames + lengths[1]
        slot, generation, _ = builder.finish()
        padded = 4 * 32  # rows x frames, and rows x tokens: both 32 here
        assert builder.stats() == BuilderStats(1, Padding(round(frames / padded, 4),
                                                          round(text / padded, 4)))  # fmt: skip
        assert builder.free(slot, generation) and builder.stats().in_flight == 0


def test_drops_report_their_counts() -> None:
    drop = Drops()
    drop("stale", "a late READY")
    drop("stale", "another")
    drop("malformed", "junk")
    assert drop.stats() == DropStats({"stale": 2, "malformed": 1})


def test_the_stager_composes_the_parts_records_into_the_keys_users_read() -> None:
    stats = StagerStats.compose(
        RunStats("r1", 12.5, 40, ((4, 32, 32),), 2, None, "producer", 5.0),
        SlotStats(45, 1, {"FREE": 3, "READY": 1}, 4, {"grants": 50, "delivered": 45}),
        BookStats((ProducerStats(name="p0", samples=45),), UnlistedProducers(2, 7, 1),
                  {"restarts": 1, "strikes": 0, "peers_banned": 0}),
        BuilderStats(2, Padding(0.5, None)),
        DeliveryStats(11, {"audio": 2, "lease": 1}, {"audio": 3, "metadata": 1}),
        ConsumerStats(True, TrainerReport(step=4, loss=0.25)),
        DeskStats((CrashReport("p1", "Traceback ..."),)),
        ControlStats(6),
        DropStats({"stale": 2}),
    )  # fmt: skip
    data = json.loads(json.dumps(stats.to_dict()))  # as stager.json holds it
    assert list(data) == STAGER_JSON_KEYS
    assert data["skipped_by_stage"] == {"audio": 2, "lease": 1}
    assert data["quarantined_by_stage"] == {"audio": 3, "metadata": 1}
    assert data["counters"] == {"grants": 50, "delivered": 45, "restarts": 1, "strikes": 0,
                                "peers_banned": 0}  # fmt: skip
    assert [data[k] for k in ("cursor", "epoch", "slots", "n_slots")] == [
        45, 1, {"FREE": 3, "READY": 1}, 4]  # fmt: skip
    assert [data[k] for k in ("batch_slots_ready", "batches", "refused_producers")] == [2, 11, 6]
    assert data["padding_efficiency"] == {"frames": 0.5, "text": None}
    assert data["buckets"] == [[4, 32, 32]] and data["dropped"] == {"stale": 2}
    assert data["producers"][0]["name"] == "p0" and data["producers"][0]["samples"] == 45
    assert data["producers_unlisted"] == {"count": 2, "samples": 7, "grants": 1}
    assert data["crashes"] == [{"name": "p1", "traceback": "Traceback ..."}]
    assert data["consumer_connected"] and data["trainer"]["step"] == 4
    assert [data[k] for k in ("run_id", "uptime_s", "n_items", "bad_metadata_lines")] == [
        "r1", 12.5, 40, 2]  # fmt: skip
    assert [data[k] for k in ("gpus", "features_device", "lease_s")] == [None, "producer", 5.0]
    assert StagerStats.from_dict(data) == stats
    idle = StagerStats.compose(
        RunStats("r1", 0.0, 40, (), 0, 0, "producer", 5.0), SlotStats(0, 0, {}, 4, {}),
        BookStats((), UnlistedProducers(), {}), BuilderStats(0, Padding()), DeliveryStats(0),
        ConsumerStats(False, None), DeskStats(()), ControlStats(0), DropStats({}),
    )  # fmt: skip
    assert idle.to_dict()["trainer"] == {}  # no report yet: {}, as stager.json always had
