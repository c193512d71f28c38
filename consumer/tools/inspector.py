"""The ring inspector: "why is my GPU idle?" in one screen (`ringfeed inspect`).

It maps both rings of a run read-only (``Ring.attach(..., writable=False)``:
an O_RDONLY descriptor and a PROT_READ mapping, so a stray write raises
instead of corrupting a slot) and subscribes to the stager's stats stream.
It never sends anything to the stager and never writes shared memory, so
attaching it cannot change a run.

Views: a live terminal screen (ANSI clear and redraw every interval, no
curses), ``--json`` (one snapshot), ``--record FILE`` (one JSON snapshot per
interval, jsonl) and ``--plot PNG --from FILE`` (a timeline of a recording).
The diagnosis itself is consumer/tools/diagnosis.py, a pure function of a snapshot;
the plot of a recording is consumer/tools/timeline.py.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from consumer.tools.diagnosis import diagnose
from consumer.tools.timeline import plot_recording
from shared import protocol as p
from shared.config import ConfigError, load_config
from shared.ring import (
    HEADER_DTYPE,
    MAGIC,
    SHM_DIR,
    BatchState,
    Ring,
    RingError,
    SlotState,
    segment_name,
    shown_state,
)
from shared.segments import list_segments, pid_alive
from shared.sockets import make_socket, recv

log = logging.getLogger(__name__)

# How long --json waits for the first stats message (the stager publishes every 0.5 s).
FIRST_STATS_WAIT_S = 2.0
# Producer rates are averaged over the stats of this many recent seconds.
RATE_WINDOW_S = 3.0
STATE_CHARS = {
    SlotState.FREE: ".",
    SlotState.GRANTED: "G",
    SlotState.WRITING: "W",
    SlotState.READY: "R",
    SlotState.FENCED: "F",
}
BOLD, RESET, CLEAR = "\x1b[1m", "\x1b[0m", "\x1b[H\x1b[2J"


def newest_run_id() -> str | None:
    """The run id of the newest sample ring in /dev/shm whose stager is alive, or None."""
    best: tuple[float, str] | None = None
    for path in list_segments():
        if not path.name.endswith("-samples"):
            continue
        try:
            raw = path.read_bytes()[: HEADER_DTYPE.itemsize]
        except OSError:
            continue  # unlinked between listing and reading: that run just ended
        if len(raw) < HEADER_DTYPE.itemsize or not raw.startswith(MAGIC):
            continue
        header = np.frombuffer(raw, dtype=HEADER_DTYPE)[0]
        if not pid_alive(int(header["owner_pid"])):
            continue
        key = (float(header["created_s"]), header["run_id"].decode())
        best = key if best is None or key > best else best
    return best[1] if best else None


def _lease_s(run_id: str, config_path: str | None) -> float | None:
    """ring.lease_s of the run: from config_path, else runs/<run_id>/config.yaml if present."""
    path = Path(config_path) if config_path else Path("runs") / run_id / "config.yaml"
    if not path.is_file():
        return None
    try:
        return load_config(path).ring.lease_s
    except ConfigError as exc:
        log.warning("cannot read ring.lease_s from %s: %s", path, exc)
        return None


class Inspector:
    """Read-only view of one run: both rings plus the stats stream. Used by main() and tests."""

    def __init__(self, run_id: str, config_path: str | None = None) -> None:
        self.run_id = run_id
        self.samples = Ring.attach(segment_name(run_id, "samples"), writable=False)
        try:
            self.batches: Ring | None = Ring.attach(segment_name(run_id, "batches"), writable=False)
        except RingError:
            self.batches = None  # the stager creates it just after the sample ring
        self.lease_s = _lease_s(run_id, config_path)
        self.ctx = zmq.Context()
        self.sub = make_socket(self.ctx, zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(self.samples.stats_endpoint)
        self.stats: dict[str, Any] | None = None
        # (stager uptime_s, {producer: samples}, delivered) of recent stats, for rates.
        self.history: deque[tuple[float, dict[str, int], int]] = deque(maxlen=64)

    def alive(self) -> bool:
        """False once the stager unlinked the ring (run ended) or died."""
        return (SHM_DIR / self.samples.name).exists() and pid_alive(self.samples.owner_pid)

    def poll_stats(self, timeout_s: float = 0.0) -> bool:
        """Take every waiting Stats message (waiting up to timeout_s for one); True if any."""
        got = False
        deadline = time.monotonic() + timeout_s
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self.sub.poll(0 if got else left_ms):
                return got
            try:
                _, msg, _ = recv(self.sub)
            except zmq.Again:
                return got
            except p.ProtocolError as exc:
                log.warning("ignored a malformed stats message: %s", exc)
                continue
            if isinstance(msg, p.Stats):
                self._take(msg.data)
                got = True

    def _take(self, data: dict[str, Any]) -> None:
        self.stats = data
        samples = {pr["name"]: int(pr.get("samples", 0)) for pr in data.get("producers", [])}
        delivered = int(data.get("counters", {}).get("delivered", 0))
        self.history.append((float(data.get("uptime_s", 0.0)), samples, delivered))

    def rates(self) -> tuple[dict[str, float], float | None]:
        """Samples/s per producer and delivered samples/s, over the last RATE_WINDOW_S."""
        if len(self.history) < 2:
            return {}, None
        t1, s1, d1 = self.history[-1]
        t0, s0, d0 = next(h for h in self.history if t1 - h[0] <= RATE_WINDOW_S)
        if t1 <= t0:
            older = self.history[-2]
            t0, s0, d0 = older
        dt = max(t1 - t0, 1e-9)
        return {n: max(0, v - s0.get(n, v)) / dt for n, v in s1.items()}, (d1 - d0) / dt

    def snapshot(self) -> dict[str, Any]:
        """Plain-data picture of the run now (ages in seconds); diagnose() reads it."""
        now = time.time()
        snap = self._ring_part(now)
        snap["lease_s"] = self.lease_s
        stats = self.stats
        snap["has_stats"] = stats is not None
        if stats is None:
            snap["notes"] = ["no stats received: ring data only (is the stager publishing?)"]
        else:
            self._stats_part(snap, stats, now)
        diagnosis = diagnose(snap)
        snap["diagnosis"] = {
            "stage": diagnosis.stage,
            "evidence": diagnosis.evidence,
            "advice": diagnosis.advice,
        }
        return snap

    def _ring_part(self, now: float) -> dict[str, Any]:
        slots = np.array(self.samples.slots)  # one copy: a consistent-enough picture
        per_slot, counts = [], {s.name: 0 for s in SlotState}
        oldest_grant = oldest_ready = None
        grants_by_producer: dict[str, int] = {}
        shown = [shown_state(rec) for rec in slots]
        for k, (rec, state) in enumerate(zip(slots, shown, strict=True)):
            counts[state.name] += 1
            age = None
            if state in (SlotState.GRANTED, SlotState.WRITING, SlotState.FENCED):
                age = now - float(rec["t_granted"])
                oldest_grant = max(age, oldest_grant or 0.0)
                who = str(int(rec["producer"]))
                grants_by_producer[who] = grants_by_producer.get(who, 0) + 1
            elif state is SlotState.READY:
                age = now - float(rec["t_ready"] or rec["t_granted"])
                oldest_ready = max(age, oldest_ready or 0.0)
            per_slot.append(
                {
                    "slot": k,
                    "state": state.name,
                    "age_s": None if age is None else round(age, 3),
                    "item": int(rec["item"]),
                    "producer": int(rec["producer"]),
                }
            )
        snap: dict[str, Any] = {
            "t": now,
            "run_id": self.run_id,
            "n_slots": len(slots),
            "slots": counts,
            "slot_bar": "".join(STATE_CHARS[s] for s in shown),
            "per_slot": per_slot,
            "oldest_grant_s": None if oldest_grant is None else round(oldest_grant, 3),
            "oldest_ready_s": None if oldest_ready is None else round(oldest_ready, 3),
            "grants_by_producer_index": grants_by_producer,
            "batch_slots": 0,
            "batch_ready": 0,
        }
        if self.batches is not None:
            states = np.array(self.batches.slots["state"])
            snap["batch_slots"] = len(states)
            snap["batch_ready"] = int((states == BatchState.SENT).sum())
            snap["batch_size"] = int(self.batches.fields["items"][0][0])  # rows, at most
        return snap

    def _stats_part(self, snap: dict[str, Any], stats: dict[str, Any], now: float) -> None:
        rates, delivered_rate = self.rates()
        if stats.get("buckets"):  # rows per batch vary with the bucket: their mean
            snap["batch_size"] = sum(b[0] for b in stats["buckets"]) / len(stats["buckets"])
        snap["producers"] = [
            {
                "name": pr["name"],
                "rate_per_s": None if pr["name"] not in rates else round(rates[pr["name"]], 2),
                "samples": pr.get("samples", 0),
                "grants": pr.get("grants", 0),
                "fenced": pr.get("fenced", 0),
                "silent_s": pr.get("silent_s", 0.0),
                "stalled": pr.get("stalled", False),
                "remote": pr.get("remote", False),
                "where": where(pr),
                "cache_hit_frac": _hit_frac(pr.get("work", {})),
            }
            for pr in stats.get("producers", [])
        ]
        snap["producers_unlisted"] = stats.get("producers_unlisted", {}).get("count", 0)
        trainer = dict(stats.get("trainer") or {})
        wall = trainer.get("step_s", 0.0) + trainer.get("wait_s", 0.0)
        if wall > 0:  # step_s is the step alone; the wait comes on top
            trainer["wait_fraction"] = round(trainer.get("wait_s", 0.0) / wall, 3)
            trainer["samples_per_s"] = round(trainer.get("rows", 0) / wall, 2)
            trainer["frames_per_s"] = round(trainer.get("frames", 0) / wall, 1)
        if "t" in trainer:
            trainer["age_s"] = round(now - trainer.pop("t"), 3)
        counters = stats.get("counters", {})
        snap.update(
            uptime_s=stats.get("uptime_s"),
            epoch=stats.get("epoch"),
            cursor=stats.get("cursor"),
            n_items=stats.get("n_items"),
            batches=stats.get("batches"),
            padding=stats.get("padding_efficiency", {}),
            buckets=stats.get("buckets", []),
            consumer_connected=stats.get("consumer_connected", False),
            trainer=trainer,
            counters=counters,
            delivered_per_s=None if delivered_rate is None else round(delivered_rate, 2),
            dropped=stats.get("dropped", {}),
            skipped=counters.get("skipped", 0),
            reclaimed=counters.get("reclaimed", 0),
            bad_metadata_lines=stats.get("bad_metadata_lines", 0),
            crashes=len(stats.get("crashes", [])),
            crash_names=[c.get("name", "?") for c in stats.get("crashes", [])],
            stager_slots=stats.get("slots", {}),
            gpus=stats.get("gpus"),
            features_device=stats.get("features_device"),
        )

    def close(self) -> None:
        """Close the socket and unmap; idempotent, never unlinks (we do not own the rings)."""
        self.sub.close()
        self.ctx.term()
        for ring in (self.samples, self.batches):
            if ring is not None:
                ring.close()


# ---------------------------------------------------------------- terminal view
def _fmt(value: float | None, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _hit_frac(work: dict[str, int]) -> float | None:
    """Share of samples served from the feature cache (None: no dataset work reported)."""
    hits, decoded = work.get("cache_hits", 0), work.get("decoded", 0)
    return hits / (hits + decoded) if hits + decoded else None


def where(pr: dict[str, Any]) -> str:
    """Where a producer runs: its host, and its Ray actor and node when it has them."""
    place = pr.get("place", "")
    return f"{pr.get('host', '')}" + (f" ({place})" if place else "")


def _padding_text(snap: dict[str, Any]) -> str:
    """'  padding: 93% of frames, 81% of tokens are real (4 buckets)', or ''."""
    pad = snap.get("padding") or {}
    if pad.get("frames") is None:
        return ""
    shapes = len(snap.get("buckets") or []) or 1
    return (f"  padding: {pad['frames']:.0%} of frames, {pad['text']:.0%} of tokens real "
            f"({shapes} shape{'s' if shapes > 1 else ''})")  # fmt: skip


def render(snap: dict[str, Any]) -> str:
    """The live screen as text (ANSI bold only); one screen, called once per refresh."""
    d = snap["diagnosis"]
    lines = [
        f"ringfeed inspect  run {snap['run_id']}  uptime {_fmt(snap.get('uptime_s'), '.0f')} s  "
        f"epoch {snap.get('epoch', '-')}  cursor {snap.get('cursor', '-')}/"
        f"{snap.get('n_items', '-')}",
        f"{BOLD}>> {d['stage'].upper()}: {'; '.join(d['evidence'][:2])}{RESET}",
        f"   advice: {d['advice']}",
        "",
        f"samples [{snap['slot_bar']}]  "
        + " ".join(f"{k}={v}" for k, v in snap["slots"].items() if v)
        + f"  oldest grant {_fmt(snap['oldest_grant_s'], '.1f')} s",
        f"batches [{'B' * snap['batch_ready']}{'.' * (snap['batch_slots'] - snap['batch_ready'])}]"
        f"  {snap['batch_ready']}/{snap['batch_slots']} waiting for the trainer"
        + _padding_text(snap),
    ]
    for note in snap.get("notes", []):
        lines.append(f"note: {note}")
    if snap.get("has_stats"):
        lines += [
            "",
            f"{'producer':24s} {'rate/s':>8s} {'grants':>6s} {'silent':>7s} {'cache':>6s}  "
            f"{'state':7s} where",
        ]
        for pr in snap["producers"]:
            state = "STALLED" if pr["stalled"] else ("fenced" if pr["fenced"] else "ok")
            lines.append(
                f"{pr['name'][:24]:24s} {_fmt(pr['rate_per_s'], '8.1f'):>8s} "
                f"{pr['grants']:6d} {pr['silent_s']:6.1f}s "
                f"{_fmt(pr.get('cache_hit_frac'), '.0%'):>6s}  {state:7s} {pr.get('where', '')}"
            )
        if snap.get("producers_unlisted"):
            lines.append(f"... and {snap['producers_unlisted']} more (the stats list 32)")
        if not snap["producers"]:
            lines.append("(no producers connected)")
        tr = snap["trainer"]
        lines += [
            "",
            f"trainer: step {tr.get('step', '-')}  step {_fmt(tr.get('step_s'), '.3f')} s  "
            f"data wait {_fmt(tr.get('wait_fraction'), '.0%')}  "
            f"{_fmt(tr.get('samples_per_s'), '.1f')} samples/s, "
            f"{_fmt(tr.get('frames_per_s'), '.0f')} true frames/s  "
            f"last report {_fmt(tr.get('age_s'), '.1f')} s ago"
            + ("" if snap["consumer_connected"] else "  (no consumer connected)"),
        ]
        c = snap["counters"]
        dropped = ", ".join(f"{k}={v}" for k, v in snap["dropped"].items()) or "none"
        lines.append(
            f"counters: delivered {c.get('delivered', 0)} ({_fmt(snap['delivered_per_s'], '.1f')}"
            f"/s)  skipped {snap['skipped']}  reclaimed {snap['reclaimed']}  "
            f"restarts {c.get('restarts', 0)}  dropped {dropped}  crashes {snap['crashes']}"
        )
    lines.append("\n(Ctrl-C to quit)")
    return "\n".join(lines)


def write_out(text: str) -> None:
    """The inspector's only terminal output: it is a CLI view, not a log."""
    sys.stdout.write(text)
    sys.stdout.flush()


def live(insp: Inspector, interval_s: float, record: str | None) -> int:
    """Redraw every interval_s until Ctrl-C or the run ends; append snapshots to record."""
    out = open(record, "a") if record else None  # noqa: SIM115 - closed in finally
    try:
        while True:
            insp.poll_stats(interval_s)
            if not insp.alive():
                write_out(f"\nrun {insp.run_id} ended: its ring is gone\n")
                return 0
            snap = insp.snapshot()
            write_out(CLEAR + render(snap) + "\n")
            if out is not None:
                out.write(json.dumps(snap) + "\n")
                out.flush()
    except KeyboardInterrupt:
        write_out("\n")
        return 0
    finally:
        if out is not None:
            out.close()


def main(
    run_id: str,
    as_json: bool = False,
    interval_s: float = 1.0,
    record: str | None = None,
    plot: str | None = None,
    recording: str | None = None,
    config_path: str | None = None,
) -> int:
    """Entry of `ringfeed inspect`; returns the exit code."""
    if plot:
        if not recording:
            log.error("--plot needs --from RECORDING (a jsonl file written by --record)")
            return 2
        plot_recording(recording, plot)
        write_out(f"wrote {plot}\n")
        return 0
    run_id = run_id or newest_run_id() or ""
    if not run_id:
        log.error("no live ringfeed run in %s: start a stager or pass --run-id", SHM_DIR)
        return 1
    try:
        insp = Inspector(run_id, config_path)
    except RingError as exc:
        log.error("%s", exc)
        return 1
    try:
        if as_json:
            # Two stats messages give producer rates; the second is worth 0.6 s more wait.
            if insp.poll_stats(FIRST_STATS_WAIT_S):
                insp.poll_stats(0.6)
            write_out(json.dumps(insp.snapshot(), indent=1) + "\n")
            return 0
        return live(insp, interval_s, record)
    finally:
        insp.close()
