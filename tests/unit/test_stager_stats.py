"""The stager's stats: each part reports its own record, and the stager composes them
into the one record of the stats stream and stager.json, whose keys users read as plain
JSON. Without processes; the worst case of the composed message is in
tests/unit/test_peer_output.py, real runs' stager.json in the process tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ringfeed.consumer.stager.drops import Drops
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.producer_book import FORGET_LEASES, ProducerBook
from ringfeed.producer.sources import SyntheticSource
from ringfeed.shared.config import Config, replace
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
from tests.support.assembled import first_batch
from tests.support.ledger_play import ROWS, Clock, answer, book, run, send_finished

HOST = "this-host"
PEER = PeerId("pool 1", "uid 0 pid 1", os.getpid())

# What stager.json and the stats stream hold, in order: users, scripts and the
# inspector read these keys as plain JSON.
STAGER_JSON_KEYS = [
    "run_id",
    "uptime_s",
    "n_items",
    "cursor",
    "epoch",
    "slots",
    "n_slots",
    "batch_slots_ready",
    "batches",
    "padding_efficiency",
    "buckets",
    "counters",
    "dropped",
    "bad_metadata_lines",
    "producers",
    "producers_unlisted",
    "crashes",
    "trainer",
    "consumer_connected",
    "refused_producers",
    "gpus",
    "features_device",
    "lease_s",
    "outliers",
    "skipped_by_stage",
    "quarantined_by_stage",
]


def join(
    m: ProducerBook, name: str, samples: int = 0, token: str = "", ident: bytes = b""
) -> bytes:
    """name joins under `ident` (default: the name) as the process `token` (default: the
    name)."""
    ident = ident or name.encode()
    hello = p.Hello(name, os.getpid(), HOST, False, token=token or name, place="", config={})
    m.hello(ident, hello, remote=False, peer=PEER)
    m.producers[ident].credits, m.producers[ident].samples = 16, samples
    return ident


def test_the_slot_ledger_reports_its_cursor_its_epoch_and_its_places() -> None:
    m = book(n_items=3, epochs=2, lookahead=1, spares=4)
    places = m.slots.stats().n_slots  # 4 batch slots of 4 rows, and 4 spares
    assert places == 4 * ROWS + 4
    ident = join(m, "a")
    grants = run(m, ident, 3)  # positions 0, 1, 2: all of epoch 0, in batch 0
    assert answer(m, ident, grants[0])
    s = m.slots.stats()
    assert (s.cursor, s.epoch, s.n_slots) == (0, 0, places)
    assert s.states == {"FREE": places - 3, "GRANTED": 2, "READY": 1}
    assert (s.counters["grants"], s.counters["answered"], s.counters["delivered"]) == (3, 1, 0)
    for g in grants[1:]:
        assert answer(m, ident, g)
    assert answer(m, ident, run(m, ident, 1)[0])  # position 3: epoch 1's first
    send_finished(m)
    s = m.slots.stats()
    assert (s.cursor, s.epoch, s.states, s.counters["delivered"]) == (4, 1, {"FREE": places}, 4)


def test_the_book_lists_working_producers_first_and_sums_the_rest() -> None:
    clock = Clock()
    m = book(n_items=100, clock=clock)
    names = [f"p{i:02d}" for i in range(MAX_LISTED_PRODUCERS + 3)]
    for i, name in enumerate(names):
        join(m, name, samples=i)
    assert len(run(m, b"p00", 1)) == 1  # the one working producer
    m.producers[b"p01"].stalled = True  # must say HELLO again: listed last
    clock.t = 2.5
    s = m.stats()
    idle = [n for n in reversed(names) if n not in ("p00", "p01")]  # by samples
    shown = ["p00", *idle][:MAX_LISTED_PRODUCERS]
    assert [row.name for row in s.producers] == shown
    first = s.producers[0]
    assert (first.grants, first.fenced, first.silent_s, first.host) == (1, 0, 2.5, HOST)
    rest = [names.index(n) for n in names if n not in shown]
    assert s.unlisted == UnlistedProducers(count=len(rest), samples=sum(rest), grants=0)
    zero = {"restarts": 0, "pauses": 0, "forgotten": 0, "strikes": 0, "peers_banned": 0}
    assert s.counters == {"joined": len(names)} | zero
    m.strike(b"p02", "lied")
    join(m, "p03", token="new")  # the same name from another process: a restart
    join(m, "p04", ident=b"p04-2")  # the same process on a new socket: neither
    expected = zero | {"joined": len(names) + 2, "restarts": 1, "strikes": 1}
    assert m.stats().counters == expected


def test_a_producer_given_up_for_its_silence_that_comes_back_is_a_pause_not_a_restart() -> None:
    """SIGSTOPped past the leases the stager waits before forgetting it: its HELLO from
    the same process is a pause, and what it sent on its old socket is no unknown peer's
    (was_forgotten names it, for the stager's "late" count)."""
    clock = Clock()
    m = book(n_items=100, clock=clock)
    join(m, "p0")
    join(m, "p1")
    clock.t = (FORGET_LEASES + 1) * m.lease_s
    m.touch(b"p1")  # p1 kept talking
    m.expire()
    assert b"p0" not in m.producers and m.was_forgotten(b"p0") == "p0"
    assert m.was_forgotten(b"p1") == ""
    join(m, "p0", ident=b"p0-2")
    join(m, "p1", ident=b"p1-2")  # the same process again while talking: no pause
    counters = m.stats().counters
    assert (counters["pauses"], counters["restarts"], counters["forgotten"]) == (1, 0, 1)
    assert counters["joined"] == 4


def test_the_assembly_reports_batches_in_flight_and_their_padding(tmp_path: Path) -> None:
    cfg = replace(
        Config(),
        data={"format": "synthetic", "synthetic_items": 2},
        features={"max_frames": 32},
        text={"max_text_len": 32},
        stager={"batch_size": 4, "epochs": 1},
    )
    source = SyntheticSource(cfg)
    with first_batch(cfg, source.prepare, tmp_path) as first:
        ledger, assembly = first.ledger, first.assembly
        text, frames = (int(first.views[k][:2].sum()) for k in ("text_lens", "mel_lens"))
        padded = 4 * 32  # rows x frames, and rows x tokens: both 32 here
        padding = Padding(round(frames / padded, 4), round(text / padded, 4))
        in_flight = lambda: ledger.progress().in_flight  # noqa: E731
        assert assembly.stats(in_flight()) == BuilderStats(0, padding)  # ready, not sent yet
        generation = ledger.sent(first.batch, first.n_valid)
        assert assembly.stats(in_flight()) == BuilderStats(1, padding)
        assert ledger.freed(first.slot, generation) and in_flight() == 0


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
        BookStats(
            (ProducerStats(name="p0", samples=45),),
            UnlistedProducers(2, 7, 1),
            {"restarts": 1, "strikes": 0, "peers_banned": 0},
        ),
        BuilderStats(2, Padding(0.5, None)),
        DeliveryStats(11, {"audio": 2, "lease": 1}, {"audio": 3, "metadata": 1}),
        ConsumerStats(True, TrainerReport(step=4, loss=0.25)),
        DeskStats((CrashReport("p1", "Traceback ..."),)),
        ControlStats(6),
        DropStats({"stale": 2}),
    )
    data = json.loads(json.dumps(stats.to_dict()))  # as stager.json holds it
    assert list(data) == STAGER_JSON_KEYS
    assert data["skipped_by_stage"] == {"audio": 2, "lease": 1}
    assert data["quarantined_by_stage"] == {"audio": 3, "metadata": 1}
    assert data["counters"] == {
        "grants": 50,
        "delivered": 45,
        "restarts": 1,
        "strikes": 0,
        "peers_banned": 0,
        "mel_fallbacks": 0,
        "mels_from_cache": 0,
        "mels_kept": 0,
        "mels_not_kept": 0,
    }
    assert [data[k] for k in ("cursor", "epoch", "slots", "n_slots")] == [
        45,
        1,
        {"FREE": 3, "READY": 1},
        4,
    ]
    assert [data[k] for k in ("batch_slots_ready", "batches", "refused_producers")] == [2, 11, 6]
    assert data["padding_efficiency"] == {"frames": 0.5, "text": None}
    assert data["buckets"] == [[4, 32, 32]] and data["dropped"] == {"stale": 2}
    assert data["producers"][0]["name"] == "p0" and data["producers"][0]["samples"] == 45
    assert data["producers_unlisted"] == {"count": 2, "samples": 7, "grants": 1}
    assert data["crashes"] == [{"name": "p1", "traceback": "Traceback ..."}]
    assert data["consumer_connected"] and data["trainer"]["step"] == 4
    assert [data[k] for k in ("run_id", "uptime_s", "n_items", "bad_metadata_lines")] == [
        "r1",
        12.5,
        40,
        2,
    ]
    assert [data[k] for k in ("gpus", "features_device", "lease_s")] == [None, "producer", 5.0]
    assert StagerStats.from_dict(data) == stats
    idle = StagerStats.compose(
        RunStats("r1", 0.0, 40, (), 0, 0, "producer", 5.0),
        SlotStats(0, 0, {}, 4, {}),
        BookStats((), UnlistedProducers(), {}),
        BuilderStats(0, Padding()),
        DeliveryStats(0),
        ConsumerStats(False, None),
        DeskStats(()),
        ControlStats(0),
        DropStats({}),
    )
    assert idle.to_dict()["trainer"] == {}  # no report yet: {}, as stager.json always had
