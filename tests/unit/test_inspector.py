"""The inspector: the stats record's round trip, diagnose() on hand-built snapshots (on
real induced stalls: tests/process/test_inspector.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ringfeed.consumer.tools.diagnosis import diagnose
from ringfeed.consumer.tools.inspector import BAR_WIDTH, state_bar
from ringfeed.consumer.tools.screen import render
from ringfeed.consumer.tools.snapshot import InspectorSnapshot, ProducerRow, RingView
from ringfeed.shared.memory.ring import SlotState
from ringfeed.shared.run.stats_record import (
    CrashReport,
    Padding,
    ProducerStats,
    StagerStats,
    TrainerReport,
    UnlistedProducers,
)


def test_stats_record_round_trips_through_plain_data() -> None:
    stats = StagerStats(
        run_id="r1",
        uptime_s=12.5,
        n_items=100,
        cursor=40,
        epoch=1,
        slots={"READY": 3, "FREE": 13},
        n_slots=16,
        batch_slots_ready=2,
        batches=9,
        padding_efficiency=Padding(0.93, None),
        buckets=((4, 64, 32), (8, 32, 16)),
        counters={"delivered": 36, "skipped": 1},
        dropped={"stale": 2},
        bad_metadata_lines=1,
        producers=(
            ProducerStats(
                "p0",
                11,
                "h",
                "actor 1",
                True,
                30,
                2,
                1,
                0.2,
                False,
                {"cache_hits": 3, "decoded": 27},
            ),
        ),
        producers_unlisted=UnlistedProducers(count=2, samples=6, grants=1),
        crashes=(CrashReport("p9", "Traceback ..."),),
        trainer=TrainerReport(8, 0.1, 0.02, 1.5, 4, 200, 1.7e9),
        consumer_connected=True,
        refused_producers=1,
        gpus=0,
        features_device="producer",
    )
    plain = stats.to_dict()
    assert json.loads(json.dumps(plain)) == plain  # lists and dicts only, as JSON reads back
    assert plain["producers"][0]["work"] == {"cache_hits": 3, "decoded": 27}
    assert plain["producers_unlisted"]["count"] == 2 and plain["buckets"][1] == [8, 32, 16]
    assert StagerStats.from_dict(plain) == stats
    assert StagerStats.from_dict(replace(stats, trainer=None).to_dict()).trainer is None


def test_stats_record_of_an_older_stager_takes_defaults() -> None:
    old = {
        "run_id": "r0",
        "counters": {"delivered": 5},
        "producers": [{"name": "p0"}],
        "trainer": {},
        "from_the_future": 1,
    }
    stats = StagerStats.from_dict(old)
    assert stats.run_id == "r0" and stats.counters == {"delivered": 5}
    assert stats.producers == (ProducerStats(name="p0"),) and stats.producers[0].work == {}
    assert stats.trainer is None and stats.padding_efficiency == Padding(None, None)
    assert stats.producers_unlisted == UnlistedProducers() and stats.gpus is None
    assert StagerStats.from_dict({}) == StagerStats()


RING = RingView(
    n_slots=16,
    slots={"FREE": 14, "GRANTED": 2, "READY": 0},
    batch_slots=3,
    batch_ready=0,
    oldest_grant_s=0.1,
    oldest_ready_s=None,
)
STATS = StagerStats(
    consumer_connected=True, trainer=TrainerReport(step=5, step_s=0.01, wait_s=0.19)
)
P0 = ProducerRow("p0", rate_per_s=20.0, grants=2, silent_s=0.1)


def _snap(
    ring: dict[str, Any] | None = None,
    stats: dict[str, Any] | None = None,
    producers: tuple[ProducerRow, ...] = (P0,),
    has_stats: bool = True,
) -> InspectorSnapshot:
    """A snapshot of a run where producers are the limit, with ring and stats fields
    replaced as given."""
    return InspectorSnapshot(
        t=0.0,
        run_id="r",
        ring=replace(RING, **(ring or {})),
        lease_s=10.0,
        stats=replace(STATS, **(stats or {})) if has_stats else None,
        producers=producers if has_stats else (),
        batch_size=4,
    )


BUSY = {"ring": {"slots": {"READY": 16}, "batch_ready": 3}}
BUSY_TRAINER = TrainerReport(step_s=0.3, wait_s=0.0)


@pytest.mark.parametrize(
    ("over", "stage"),
    [
        ({"has_stats": False}, "starting"),
        ({"stats": {"consumer_connected": False}}, "starting"),
        ({"stats": {"consumer_connected": False, "batches": 5}}, "no-consumer"),
        ({"ring": {"oldest_grant_s": 12.0}}, "stuck-producer"),
        ({"producers": (ProducerRow("p0", stalled=True, silent_s=11.0),)}, "stuck-producer"),
        ({}, "producers"),
        ({"ring": {"slots": {"READY": 14, "GRANTED": 2}, "oldest_ready_s": 2.0}}, "stager"),
        (
            {
                "ring": {
                    "slots": {"READY": 14, "GRANTED": 2},
                    "oldest_ready_s": 0.5,
                    "oldest_grant_s": 3.0,
                }
            },
            "producers",
        ),
        ({**BUSY, "stats": {"trainer": BUSY_TRAINER}}, "trainer"),
        ({"stats": {"trainer": None}}, "compiling"),
        ({**BUSY, "stats": {"trainer": None}}, "compiling"),
    ],
)
def test_diagnose_stages(over: dict[str, Any], stage: str) -> None:
    d = diagnose(_snap(**over))
    assert d.stage == stage, d
    assert d.evidence and d.advice


def test_a_stale_trainer_report_gives_no_verdict_of_its_own() -> None:
    """A stall: the trainer reports nothing while it waits, and its last report, from
    before the stall, said it waited 0 %. Read as fresh, that was "the trainer is the
    limit ... this is the goal" for the first seconds of every stall."""
    before_stall = TrainerReport(step=40, step_s=0.3, wait_s=0.0, loss=1.5, t=100.0)
    fresh = replace(_snap(stats={"trainer": before_stall}, **BUSY), t=100.5)
    assert diagnose(fresh).stage == "trainer" and "goal" in diagnose(fresh).advice
    stalled = replace(_snap(stats={"trainer": before_stall}), t=103.0)  # batch ring empty
    d = diagnose(stalled)
    assert d.stage == "producers" and "no trainer step for 3 s: it waits for data" in d.evidence
    assert "goal" not in d.advice
    # Batches wait and the trainer says nothing: it is stuck, not "the goal".
    stuck = replace(_snap(stats={"trainer": before_stall}, **BUSY), t=110.0)
    d = diagnose(stuck)
    assert d.stage == "trainer" and "no trainer step for 10 s while 3 batch(es)" in d.evidence[0]
    assert "goal" not in d.advice
    # Stats that stopped arriving: marked, and no verdict from them.
    old = replace(_snap(**BUSY, stats={"trainer": before_stall}), t=100.5, stats_age_s=9.0)
    d = diagnose(old)
    assert d.stage == "stale" and "9 s old" in d.evidence[0]
    assert "STATS 9 s OLD" in render(old)


def test_no_producer_with_grants_out_says_so_not_that_a_lease_will_fix_it() -> None:
    d = diagnose(_snap(ring={"oldest_grant_s": 12.0}, producers=()))
    assert d.stage == "producers" and d.evidence[0].startswith("no producer connected")
    assert "lease will reclaim" not in d.advice and "pool's log" in d.advice


def test_the_screen_shows_the_loss_and_the_logs_tail() -> None:
    report = TrainerReport(step=40, step_s=0.3, wait_s=0.01, loss=1.2345, t=100.0)
    screen = render(replace(_snap(stats={"trainer": report}), t=100.2), ["step 40 loss 1.23"])
    assert "loss 1.2345" in screen and "log:\n  step 40 loss 1.23" in screen


def test_the_screen_shows_the_cursor_as_epoch_and_item_and_the_shard_cache() -> None:
    """`cursor 800/40` read like a bug: the plan position against one epoch's size."""
    work = {
        "shard_hits": 30,
        "shards_fetched": 10,
        "shard_bytes_fetched": 3 * 2**20,
        "store_retries": 1,
    }
    producers = (ProducerStats("p0", work=work), ProducerStats("p1", work=work))
    stats = {"cursor": 812, "epoch": 20, "n_items": 40, "producers": producers}
    screen = render(_snap(stats=stats))
    assert "epoch 20, item 12/40 of it (plan position 812)" in screen
    assert "shard cache: 60 hits, 20 shards fetched (6.0 MiB), hit rate 75%, 2 retries" in screen
    assert "shard cache" not in render(_snap())  # no shards read: no line


def test_producers_evidence_quotes_numbers() -> None:
    d = diagnose(_snap())
    assert "95%" in d.evidence[0] and "20.0 samples/s" in d.evidence[1]
    # 4 rows per 0.01 s step (the wait excluded): 400 samples/s, 20 producers at 20/s.
    assert "the trainer could take 400 samples/s" in d.evidence[2]
    assert "producers.workers (about 20 to keep up" in d.advice


@pytest.mark.parametrize("device", ["producer", "stager"])
def test_advice_fits_a_host_without_gpu(device: str) -> None:
    """No GPU: never advise stager-side mels, never call the limit 'the GPU'."""
    cpu = {"gpus": 0, "features_device": device}
    slow = diagnose(_snap(stats=cpu))
    assert slow.stage == "producers" and "mels on the GPU" not in slow.advice
    if device == "stager":
        assert "features.device: producer" in slow.advice
    trainer = diagnose(_snap(**BUSY, stats={**cpu, "trainer": BUSY_TRAINER}))
    assert trainer.stage == "trainer" and "GPU" not in " ".join(trainer.evidence)
    assert "the trainer's CPU step is the limit" in trainer.evidence[0]


def test_a_trainer_compiling_its_first_step_is_not_called_the_limit() -> None:
    """Connected, no step reported, batches ready: it compiles; it used to read "batch
    ring full: the trainer is the limit" (and "this is the goal")."""
    d = diagnose(_snap(**BUSY, stats={"trainer": None}))
    assert d.stage == "compiling" and "has not finished its first step" in d.evidence[0]
    assert "goal" not in d.advice and "3 batch(es) are ready" in d.advice


@pytest.mark.parametrize(
    ("gpus", "says", "never"),
    [
        (0, "no GPU", "mixed_precision"),
        (1, "shares the one GPU with the stager", "devices.model, a replica"),
        (4, "4 GPUs here", "no GPU"),
    ],
)
def test_a_busy_trainers_advice_fits_the_host(gpus: int, says: str, never: str) -> None:
    d = diagnose(_snap(**BUSY, stats={"gpus": gpus, "trainer": BUSY_TRAINER}))
    assert d.stage == "trainer" and says in d.advice and never not in d.advice, d.advice


def test_a_stager_whose_device_failed_its_mels_says_they_run_on_the_cpu() -> None:
    stager_bound = {"slots": {"READY": 14, "GRANTED": 2}, "oldest_ready_s": 2.0}
    fell_back = {"gpus": 2, "features_device": "stager", "counters": {"mel_fallbacks": 1}}
    d = diagnose(_snap(ring=stager_bound, stats=fell_back))
    assert d.stage == "stager" and "run on the CPU since" in d.advice, d
    assert "run on the CPU since" not in diagnose(_snap(ring=stager_bound)).advice


def test_advice_on_a_gpu_host_offers_stager_mels_and_names_the_gpu() -> None:
    gpu = {"gpus": 2, "features_device": "producer"}
    assert "features.device: stager (mels on the GPU)" in diagnose(_snap(stats=gpu)).advice
    busy = _snap(**BUSY, stats={**gpu, "trainer": BUSY_TRAINER})
    assert "the GPU is the limit" in diagnose(busy).evidence[0]


def test_json_of_a_snapshot_keeps_the_keys_of_before() -> None:
    """`inspect --json` and `--record` readers (timeline.py, scripts) keep their keys."""
    ring_keys = {
        "t",
        "run_id",
        "n_slots",
        "slots",
        "slot_bar",
        "per_slot",
        "oldest_grant_s",
        "oldest_ready_s",
        "grants_by_producer_index",
        "batch_slots",
        "batch_ready",
        "batch_size",
        "lease_s",
        "has_stats",
        "notes",
        "diagnosis",
    }
    stats_keys = {
        "producers",
        "producers_unlisted",
        "uptime_s",
        "epoch",
        "cursor",
        "n_items",
        "batches",
        "padding",
        "buckets",
        "consumer_connected",
        "trainer",
        "counters",
        "delivered_per_s",
        "dropped",
        "skipped",
        "reclaimed",
        "bad_metadata_lines",
        "crashes",
        "crash_names",
        "stager_slots",
        "gpus",
        "features_device",
        "stats_age_s",
    }
    starting = _snap(has_stats=False).to_dict()
    assert set(starting) == ring_keys and starting["notes"]
    snap = _snap()
    data = json.loads(json.dumps(snap.to_dict()))
    assert set(data) == ring_keys | stats_keys
    assert data["diagnosis"]["stage"] == snap.diagnosis.stage == "producers"
    assert data["producers"][0]["rate_per_s"] == 20.0 and data["trainer"]["step"] == 5
    assert "PRODUCERS" in render(snap) and "p0" in render(snap)
    assert "note: no stats received" in render(_snap(has_stats=False))


# ---------------------------------------------------------------- real runs


def test_the_places_line_fits_a_screen_and_never_hides_a_fence() -> None:
    """A run with many places (buckets of many short rows, many credits): a character
    stands for a group, showing the state of the group that says most."""
    free, ready, fenced = SlotState.FREE, SlotState.READY, SlotState.FENCED
    assert state_bar([free, ready, fenced]) == ".RF"  # few places: one character each
    many = [free] * 200 + [ready] * 100
    many[37] = fenced
    bar = state_bar(many)
    assert len(bar) <= BAR_WIDTH and bar.count("F") == 1 and bar.endswith("R" * 25)  # 4 a character
