"""Which stage limits a run now: a pure function of one inspector snapshot.

The inspector (consumer/tools/inspector.py) calls :func:`diagnose` once per refresh
(through ``InspectorSnapshot.diagnosis``) and tests call it on hand-built
snapshots. It reads the attributes of :class:`consumer.tools.snapshot.InspectorSnapshot`:
the ring part always, the stager's stats (``snap.stats``) once they arrived, so a
snapshot taken before the first stats message still gets an answer.

The rules, in order (the first that holds names the stage)::

    the last stats are older than STATS_STALE_S                       stale
    no stats yet, or no consumer yet                                  starting
    a consumer connected, no step of its reported yet                 compiling
    stats say the consumer left                                       no-consumer
    no producer connected                                             producers
    a grant older than ring.lease_s, a stalled or fenced producer     stuck-producer
    the trainer's last step report is stale and batches wait for it   trainer (stuck)
    trainer waits < 10 % of its step, or the batch ring is full       trainer
      (advice fits the stager's host, stats "gpus": none, one, several)
    places mostly READY, yet the batch ring is empty                  stager
      (unless an older grant blocks them: deterministic order)        producers
    otherwise (slots FREE/GRANTED, trainer waiting)                   producers

A stale source never gives a verdict of its own: stale stats give "stale", and
a trainer report older than a few of its steps is not read as the trainer's
wait (during a stall the trainer reports nothing, and its last report, from
before the stall, said it waited 0 %: "this is the goal" was wrong for the
first seconds of every stall).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ringfeed.consumer.tools.snapshot import InspectorSnapshot
    from ringfeed.shared.run.stats_record import StagerStats, TrainerReport

STAGES = (
    "stale",
    "starting",
    "compiling",
    "no-consumer",
    "stuck-producer",
    "producers",
    "stager",
    "trainer",
)
# The stager publishes stats every 0.5 s: older ones mean it is stuck, stopped or gone.
STATS_STALE_S = 3.0
# A trainer report is stale when older than this many of its steps (step plus wait) ...
TRAINER_STALE_STEPS = 3
# ... and than this, seconds (a fast step's report may lag by a poll or two).
TRAINER_STALE_MIN_S = 2.0
# Below this data-wait fraction of a step, the GPU is the limit (the goal).
WAIT_LOW = 0.10
# Places (rows being filled, spares) at least this READY wait for the stager, not producers.
READY_HIGH = 0.5


@dataclass(frozen=True)
class Diagnosis:
    """stage: one of STAGES; evidence: lines quoting numbers; advice: what to change."""

    stage: str
    evidence: list[str] = field(default_factory=list)
    advice: str = ""

    def line(self) -> str:
        """The one-line summary the live view prints in bold."""
        return f"{self.stage}: {self.evidence[0] if self.evidence else ''}"


def _wait_fraction(trainer: TrainerReport | None) -> float | None:
    """Share of the trainer's wall time spent waiting for data (step_s excludes the wait)."""
    if trainer is None or trainer.step_s + trainer.wait_s <= 0:
        return None
    return max(0.0, min(1.0, trainer.wait_s / (trainer.step_s + trainer.wait_s)))


def _stuck(snap: InspectorSnapshot) -> list[str]:
    """Evidence of a producer holding grants it does not finish; empty if none."""
    lines = []
    lease_s, oldest = snap.lease_s, snap.ring.oldest_grant_s
    if lease_s and oldest is not None and oldest > lease_s:
        lines.append(f"a grant is {oldest:.1f} s old > ring.lease_s={lease_s:g} s")
    for pr in snap.producers:
        if pr.stalled:
            lines.append(f"producer {pr.name} stalled: silent {pr.silent_s:.1f} s")
        elif pr.grants and lease_s and pr.silent_s > lease_s:
            lines.append(f"producer {pr.name} silent {pr.silent_s:.1f} s holding grants")
    fenced = snap.ring.count("FENCED")
    if fenced:
        lines.append(f"{fenced} slot(s) FENCED (lease expired while the producer may live)")
    return lines


def _producers_advice(snap: InspectorSnapshot, stats: StagerStats) -> tuple[list[str], str]:
    """Evidence and advice when producers are too slow, with the worker count to aim for."""
    producers = snap.producers
    rate = sum(pr.rate_per_s or 0.0 for pr in producers)
    evidence = [f"{len(producers)} producer(s) make {rate:.1f} samples/s"]
    trainer = stats.trainer
    need = None
    if trainer is not None and trainer.step_s and snap.batch_size:
        compute_s = max(trainer.step_s, 1e-3)  # step_s is the step alone, the wait excluded
        need = snap.batch_size / compute_s
        evidence.append(f"the trainer could take {need:.0f} samples/s")
    advice = "raise producers.workers"
    if need and rate > 0 and producers:
        workers = math.ceil(need / (rate / len(producers)))
        # Past ~64 workers the estimate says "the step is free", not a worker count.
        if workers <= 64:
            advice += f" (about {workers} to keep up, CPU cores allowing)"
    advice += ", turn on features.cache"
    gpus, device = stats.gpus, stats.features_device
    if device == "stager" and gpus == 0:
        advice += ", or set features.device: producer (no GPU here: stager mels run on the CPU)"
    elif device != "stager" and gpus != 0:
        advice += ", or set features.device: stager (mels on the GPU)"
    return evidence, advice


def _stager_mel_advice(stats: StagerStats) -> str:
    if stats.features_device != "stager":
        return ""
    if stats.counters.get("mel_fallbacks"):
        return (
            "; its device failed its batch mels and they run on the CPU since (the stager's "
            "log says why): restart the run to use the device again"
        )
    if stats.gpus == 0:
        return "; its batch mels run on the CPU here: set features.device: producer"
    return "; its batch mels run per batch on its device: give it a GPU of its own"


def trainer_age_s(snap: InspectorSnapshot) -> float | None:
    """Seconds since the trainer's last step report reached the stager (None: unknown)."""
    report = snap.stats.trainer if snap.stats is not None else None
    if report is None or not report.t or not snap.t:
        return None
    return max(0.0, snap.t - report.t)


def trainer_stale(snap: InspectorSnapshot) -> bool:
    """True when the trainer's last report is too old to say how it spends its time."""
    age, report = trainer_age_s(snap), snap.stats.trainer if snap.stats else None
    if age is None or report is None:
        return False
    return age > max(TRAINER_STALE_MIN_S, TRAINER_STALE_STEPS * (report.step_s + report.wait_s))


def _not_running(snap: InspectorSnapshot, stats: StagerStats, ring_line: str) -> Diagnosis | None:
    """starting (no consumer yet), no-consumer, no producer at all, or stuck-producer;
    None if none holds."""
    if not stats.consumer_connected and not stats.batches:
        return Diagnosis(
            "starting",
            [
                "no trainer has connected yet (it may still be importing TensorFlow or "
                "building its model)",
                ring_line,
            ],
            "wait; scripts/launch.sh starts one. Without it: `ringfeed trainer CONFIG --run-id R`",
        )
    if not stats.consumer_connected:
        return Diagnosis(
            "no-consumer",
            [
                f"the consumer left after {stats.batches} batches: the stager grants nothing "
                "until one says hello",
                ring_line,
            ],
            "look at the trainer's log; resume it with `ringfeed trainer CONFIG --run-id R`",
        )
    stuck = _stuck(snap)
    if not snap.producers:
        crashes = len(stats.crashes)
        return Diagnosis(
            "producers",
            [f"no producer connected ({crashes} crash(es) reported)", *stuck, ring_line],
            "start producers (`ringfeed producers CONFIG --run-id R`), or read the pool's log: "
            "it may have exited; grants they held come back after ring.lease_s",
        )
    if stuck:
        return Diagnosis(
            "stuck-producer",
            [*stuck, ring_line],
            "the lease will reclaim it; look at that producer's log and input "
            "(quarantine.jsonl), or lower ring.lease_s to reclaim sooner",
        )
    return None


def _ready_but_no_batch(
    snap: InspectorSnapshot, stats: StagerStats, n_slots: int, ring_line: str, wait_line: str | None
) -> Diagnosis:
    """Most places READY and no batch: a slow item holds the order, or the stager."""
    ready = snap.ring.count("READY")
    oldest_grant, oldest_ready = snap.ring.oldest_grant_s, snap.ring.oldest_ready_s
    if oldest_grant is not None and oldest_ready is not None and oldest_grant > oldest_ready:
        evidence, advice = _producers_advice(snap, stats)
        return Diagnosis(
            "producers",
            [
                f"{ready} READY places wait behind a grant {oldest_grant:.1f} s old "
                "(deterministic order): one slow item or producer",
                *evidence,
                ring_line,
            ],
            advice + "; or stager.deterministic: false",
        )
    return Diagnosis(
        "stager",
        [f"{ready}/{n_slots} places READY but the batch ring is empty"]
        + ([wait_line] if wait_line else []),
        "the stager checks and sends batches too slowly: give it a core of its own"
        + _stager_mel_advice(stats),
    )


def _trainer_advice(gpus: int | None) -> str:
    """What makes the step cheaper on this host (stats "gpus": None when not counted)."""
    goal = "this is the goal; spare producers cost CPU only. To go faster: "
    if gpus == 0:
        return goal + (
            "this host has no GPU, so the step runs on the CPU (mixed precision "
            "is off there): a smaller model or batch, train.cpu_threads, or a host "
            "with a GPU"
        )
    if gpus == 1:
        return goal + (
            "the model shares the one GPU with the stager: train.mixed_precision, "
            "a smaller batch or model, or a second GPU (devices.model)"
        )
    if gpus is None:
        return goal + "make the step cheaper (mixed precision on a GPU, a smaller batch or model)"
    return goal + (
        f"{gpus} GPUs here: spread the model over those the stager does not use "
        "(devices.model, a replica each), and train.mixed_precision"
    )


def _stuck_trainer(age_s: float, batch_ready: int, ring_line: str) -> Diagnosis:
    return Diagnosis(
        "trainer",
        [
            f"no trainer step for {age_s:.0f} s while {batch_ready} batch(es) wait for it: "
            "it is stuck in a step, compiling, or stopped",
            ring_line,
        ],
        "read the trainer's log (XLA compiles each new batch shape once: a long first "
        "step of a bucket is normal)",
    )


def diagnose(snap: InspectorSnapshot) -> Diagnosis:
    """Name the stage that limits the run now; pure, called by the inspector each refresh."""
    ring, stats = snap.ring, snap.stats
    n_slots = ring.n_slots or max(sum(ring.slots.values()), 1)
    ready = ring.count("READY")
    batch_ready, batch_slots = ring.batch_ready, ring.batch_slots
    ring_line = (
        f"places {ready}/{n_slots} READY, {ring.count('GRANTED')} GRANTED, "
        f"{ring.count('FREE')} FREE; batch ring {batch_ready}/{batch_slots} ready"
    )
    if stats is None:
        return Diagnosis("starting", ["no stats from the stager yet", ring_line], "wait")
    if snap.stats_age_s is not None and snap.stats_age_s > STATS_STALE_S:
        return Diagnosis(
            "stale",
            [
                f"the stager's last stats are {snap.stats_age_s:.0f} s old: it is stuck, "
                "stopped or gone (what follows is from then)",
                ring_line,
            ],
            "read the stager's log; after a crash `ringfeed cleanup` removes what it left",
        )
    wait = _wait_fraction(stats.trainer)
    wait_line = f"trainer waits for data {wait:.0%} of the time" if wait is not None else None
    early = _not_running(snap, stats, ring_line)
    if early is not None:
        return early
    if trainer_stale(snap):
        age = trainer_age_s(snap) or 0.0
        if batch_ready:
            return _stuck_trainer(age, batch_ready, ring_line)
        wait, wait_line = None, f"no trainer step for {age:.0f} s: it waits for data"
    elif stats.trainer is None:
        return Diagnosis(
            "compiling",
            [
                "the trainer connected and has not finished its first step: TensorFlow is "
                "building it and XLA compiling it (tens of seconds, once per batch shape)",
                ring_line,
            ],
            "wait: no stage is the limit yet"
            + (f"; {batch_ready} batch(es) are ready for it" if batch_ready else ""),
        )
    if (wait is not None and wait < WAIT_LOW) or batch_ready >= batch_slots:
        if wait is not None and wait < WAIT_LOW:
            where = {0: "the trainer's CPU step", None: "the train step"}.get(stats.gpus, "the GPU")
            first = f"{wait_line}: {where} is the limit"
        else:
            first = f"batch ring full ({batch_ready}/{batch_slots}): the trainer is the limit"
        return Diagnosis("trainer", [first, ring_line], _trainer_advice(stats.gpus))
    if ready >= READY_HIGH * n_slots and batch_ready == 0:
        return _ready_but_no_batch(snap, stats, n_slots, ring_line, wait_line)
    evidence, advice = _producers_advice(snap, stats)
    return Diagnosis("producers", [wait_line or "trainer waiting", *evidence, ring_line], advice)
