"""Which stage limits a run now: a pure function of one inspector snapshot.

The inspector (consumer/tools/inspector.py) calls :func:`diagnose` once per refresh
and tests call it on hand-built snapshots. The snapshot keys it reads are the
ones :func:`consumer.tools.inspector.snapshot` writes; every key is optional, so a
snapshot taken before the first stats message still gets an answer.

The rules, in order (the first that holds names the stage)::

    no stats yet, or the stager has not seen its consumer's steps    starting
    stats say no consumer connected                                   no-consumer
    a grant older than ring.lease_s, a stalled or fenced producer     stuck-producer
    no producer connected                                             producers
    trainer waits < 10 % of its step, or the batch ring is full       trainer
      (advice names the GPU only where the stager's host has one: snapshot "gpus")
    sample ring mostly READY, yet the batch ring is empty             stager
      (unless an older grant blocks them: deterministic order)        producers
    otherwise (slots FREE/GRANTED, trainer waiting)                   producers
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

STAGES = ("starting", "no-consumer", "stuck-producer", "producers", "stager", "trainer")
# Below this data-wait fraction of a step, the GPU is the limit (the goal).
WAIT_LOW = 0.10
# A sample ring at least this READY is waiting for the stager, not for producers.
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


def _wait_fraction(trainer: dict[str, Any]) -> float | None:
    """Share of the trainer's wall time spent waiting for data (step_s excludes the wait)."""
    step_s, wait_s = trainer.get("step_s"), trainer.get("wait_s")
    if step_s is None or wait_s is None or step_s + wait_s <= 0:
        return None
    return max(0.0, min(1.0, wait_s / (step_s + wait_s)))


def _stuck(snap: dict[str, Any]) -> list[str]:
    """Evidence of a producer holding grants it does not finish; empty if none."""
    lines = []
    lease_s, oldest = snap.get("lease_s"), snap.get("oldest_grant_s")
    if lease_s and oldest is not None and oldest > lease_s:
        lines.append(f"a grant is {oldest:.1f} s old > ring.lease_s={lease_s:g} s")
    for pr in snap.get("producers", []):
        if pr.get("stalled"):
            lines.append(f"producer {pr['name']} stalled: silent {pr.get('silent_s', 0):.1f} s")
        elif pr.get("grants") and lease_s and pr.get("silent_s", 0) > lease_s:
            lines.append(f"producer {pr['name']} silent {pr['silent_s']:.1f} s holding grants")
    fenced = snap.get("slots", {}).get("FENCED", 0)
    if fenced:
        lines.append(f"{fenced} slot(s) FENCED (lease expired while the producer may live)")
    return lines


def _producers_advice(snap: dict[str, Any]) -> tuple[list[str], str]:
    """Evidence and advice when producers are too slow, with the worker count to aim for."""
    producers = snap.get("producers", [])
    rate = sum(pr.get("rate_per_s") or 0.0 for pr in producers)
    evidence = [f"{len(producers)} producer(s) make {rate:.1f} samples/s"]
    trainer = snap.get("trainer", {})
    need = None
    if trainer.get("step_s") and snap.get("batch_size"):
        compute_s = max(trainer["step_s"] - trainer.get("wait_s", 0.0), 1e-3)
        need = snap["batch_size"] / compute_s
        evidence.append(f"the trainer could take {need:.0f} samples/s")
    advice = "raise producers.workers"
    if need and rate > 0 and producers:
        workers = math.ceil(need / (rate / len(producers)))
        # Past ~64 workers the estimate says "the step is free", not a worker count.
        if workers <= 64:
            advice += f" (about {workers} to keep up, CPU cores allowing)"
    advice += ", turn on features.cache"
    gpus, device = snap.get("gpus"), snap.get("features_device")
    if device == "stager" and gpus == 0:
        advice += ", or set features.device: producer (no GPU here: stager mels run on the CPU)"
    elif device != "stager" and gpus != 0:
        advice += ", or set features.device: stager (mels on the GPU)"
    return evidence, advice


def _stager_mel_advice(snap: dict[str, Any]) -> str:
    if snap.get("features_device") != "stager":
        return ""
    if snap.get("gpus") == 0:
        return "; its batch mels run on the CPU here: set features.device: producer"
    return "; its batch mels run per batch on its device: give it a GPU of its own"


def _not_running(snap: dict[str, Any], ring_line: str) -> Diagnosis | None:
    """starting, no-consumer, stuck-producer or no producer at all; None if none holds."""
    if not snap.get("has_stats"):
        return Diagnosis("starting", ["no stats from the stager yet", ring_line], "wait")
    if not snap.get("consumer_connected"):
        return Diagnosis(
            "no-consumer",
            ["no trainer connected: the stager grants nothing until one says hello", ring_line],
            "start `ringfeed trainer CFG --run-id R` (or `ringfeed drain`)",
        )
    stuck = _stuck(snap)
    if stuck:
        return Diagnosis(
            "stuck-producer",
            [*stuck, ring_line],
            "the lease will reclaim it; look at that producer's log and input "
            "(quarantine.jsonl), or lower ring.lease_s to reclaim sooner",
        )
    if not snap.get("producers"):
        crashes = snap.get("crashes", 0)
        return Diagnosis(
            "producers",
            [f"no producer connected ({crashes} crash(es) reported)", ring_line],
            "start `ringfeed producers CFG --run-id R`; check crash tracebacks in the stager log",
        )
    return None


def _ready_but_no_batch(snap: dict[str, Any], ring_line: str, wait_line: str | None) -> Diagnosis:
    """Most sample slots READY and no batch: a slow item holds the order, or the stager."""
    slots, n_slots = snap.get("slots", {}), snap.get("n_slots")
    ready = slots.get("READY", 0)
    oldest_grant, oldest_ready = snap.get("oldest_grant_s"), snap.get("oldest_ready_s")
    if oldest_grant is not None and oldest_ready is not None and oldest_grant > oldest_ready:
        evidence, advice = _producers_advice(snap)
        return Diagnosis(
            "producers",
            [
                f"{ready} READY slots wait behind a grant {oldest_grant:.1f} s old "
                "(deterministic order): one slow item or producer",
                *evidence,
                ring_line,
            ],
            advice + "; or stager.deterministic: false",
        )
    return Diagnosis(
        "stager",
        [f"{ready}/{n_slots} sample slots READY but the batch ring is empty"]
        + ([wait_line] if wait_line else []),
        "the stager copies samples into batches too slowly: give it a core of its own"
        + _stager_mel_advice(snap),
    )


def diagnose(snap: dict[str, Any]) -> Diagnosis:
    """Name the stage that limits the run now; pure, called by the inspector each refresh."""
    slots = snap.get("slots", {})
    n_slots = snap.get("n_slots") or max(sum(slots.values()), 1)
    ready = slots.get("READY", 0)
    batch_ready, batch_slots = snap.get("batch_ready", 0), snap.get("batch_slots", 3)
    wait = _wait_fraction(snap.get("trainer") or {})
    ring_line = (
        f"sample ring {ready}/{n_slots} READY, {slots.get('GRANTED', 0)} GRANTED, "
        f"{slots.get('FREE', 0)} FREE; batch ring {batch_ready}/{batch_slots} ready"
    )
    wait_line = f"trainer waits for data {wait:.0%} of the time" if wait is not None else None
    early = _not_running(snap, ring_line)
    if early is not None:
        return early
    if wait is None and batch_ready < batch_slots:
        return Diagnosis("starting", ["no trainer step reported yet", ring_line], "wait")
    if (wait is not None and wait < WAIT_LOW) or batch_ready >= batch_slots:
        if wait is not None and wait < WAIT_LOW:
            where = {0: "the trainer's CPU step", None: "the train step"}.get(
                snap.get("gpus"), "the GPU"
            )
            first = f"{wait_line}: {where} is the limit"
        else:
            first = f"batch ring full ({batch_ready}/{batch_slots}): the trainer is the limit"
        return Diagnosis(
            "trainer",
            [first, ring_line],
            "this is the goal; to go faster make the step cheaper (mixed precision, "
            "batch size); spare producers cost CPU only",
        )
    if ready >= READY_HIGH * n_slots and batch_ready == 0:
        return _ready_but_no_batch({**snap, "n_slots": n_slots}, ring_line, wait_line)
    evidence, advice = _producers_advice(snap)
    return Diagnosis("producers", [wait_line or "trainer waiting", *evidence, ring_line], advice)
