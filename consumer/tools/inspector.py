"""The ring inspector: "why is my GPU idle?" in one screen (`ringfeed inspect`).

It maps both rings of a run read-only (``Ring.attach(..., writable=False)``:
an O_RDONLY descriptor and a PROT_READ mapping, so a stray write raises
instead of corrupting a slot) and subscribes to the stager's stats stream.
It never sends anything to the stager and never writes shared memory, so
attaching it cannot change a run.

Each refresh gives one typed snapshot (consumer/tools/snapshot.py,
InspectorSnapshot: the rings, the stager's last StagerStats, rates). Views: a
live terminal screen (consumer/tools/screen.py: ANSI clear and redraw every
interval, no curses), ``--json`` (one snapshot's to_dict), ``--record FILE``
(one per interval, jsonl) and ``--plot PNG --from FILE`` (a timeline of a
recording, consumer/tools/timeline.py). The diagnosis itself is
consumer/tools/diagnosis.py, a pure function of a snapshot.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

import numpy as np
import zmq

from ringfeed.consumer.tools.screen import CLEAR, render
from ringfeed.consumer.tools.snapshot import (
    InspectorSnapshot,
    ProducerRow,
    RingView,
    SlotView,
    TrainerFigures,
)
from ringfeed.consumer.tools.timeline import plot_recording
from ringfeed.shared.config import ConfigError, load_config
from ringfeed.shared.config.extras import MissingExtra
from ringfeed.shared.memory.batch_ring import BatchState
from ringfeed.shared.memory.ring import (
    SHM_DIR,
    Ring,
    RingError,
    SlotState,
    segment_name,
    shown_state,
)
from ringfeed.shared.memory.segments import list_segments, read_header, segment_live
from ringfeed.shared.run.stats_record import StagerStats
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.sockets import make_socket, recv

log = logging.getLogger(__name__)

# How long --json waits for the first stats message (the stager publishes every 0.5 s).
FIRST_STATS_WAIT_S = 2.0
# Lines of the run's log the live screen shows under it (--log).
LOG_LINES = 8
# Producer rates are averaged over the stats of this many recent seconds.
RATE_WINDOW_S = 3.0
STATE_CHARS = {
    SlotState.FREE: ".",
    SlotState.GRANTED: "G",
    SlotState.WRITING: "W",
    SlotState.READY: "R",
    SlotState.FENCED: "F",
}
# The places line fits a screen: past this many places, a character stands for several,
# showing the state of theirs that says most (fenced, writing, granted, ready, free).
BAR_WIDTH = 96
BAR_RANK = (SlotState.FREE, SlotState.READY, SlotState.GRANTED, SlotState.WRITING, SlotState.FENCED)


def state_bar(states: list[SlotState], width: int = BAR_WIDTH) -> str:
    """One character per place, or per group of ceil(n / width) places beyond width."""
    per = max(1, -(-len(states) // width))
    groups = (states[k : k + per] for k in range(0, len(states), per))
    return "".join(STATE_CHARS[max(g, key=BAR_RANK.index)] for g in groups)


def newest_run_id() -> str | None:
    """The run id of the newest spare ring in /dev/shm whose stager is alive, or None."""
    best: tuple[float, str] | None = None
    for path in list_segments():
        if not path.name.endswith("-spares"):
            continue
        header = read_header(path)  # None: not a ring, or unlinked: that run just ended
        if header is None or not segment_live(path, header):
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
        self.spares = Ring.attach(segment_name(run_id, "spares"), writable=False)
        try:
            self.batches: Ring | None = Ring.attach(segment_name(run_id, "batches"), writable=False)
        except RingError:
            self.batches = None  # the stager creates it just after the spare ring
        self.lease_s = _lease_s(run_id, config_path)
        self.ctx = zmq.Context()
        self.sub = make_socket(self.ctx, zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(self.spares.stats_endpoint)
        self.stats: StagerStats | None = None
        self.stats_at = 0.0  # time.time() when the last stats message arrived
        # (stager uptime_s, {producer: samples}, delivered) of recent stats, for rates.
        self.history: deque[tuple[float, dict[str, int], int]] = deque(maxlen=64)

    def alive(self) -> bool:
        """False once the stager unlinked the ring (run ended) or died."""
        path = SHM_DIR / self.spares.name
        return path.exists() and segment_live(path, self.spares.header)

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
                self._take(StagerStats.from_dict(msg.data))
                got = True

    def _take(self, stats: StagerStats) -> None:
        self.stats, self.stats_at = stats, time.time()
        samples = {pr.name: pr.samples for pr in stats.producers}
        self.history.append((stats.uptime_s, samples, stats.counters.get("delivered", 0)))

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

    def snapshot(self) -> InspectorSnapshot:
        """The run now (time.time(), ages in seconds); its diagnosis reads it."""
        now, stats = time.time(), self.stats
        snap = InspectorSnapshot(
            now,
            self.run_id,
            self._ring_view(now),
            # The stager's own word first: a config file may not be where we look.
            stats.lease_s if stats is not None and stats.lease_s else self.lease_s,
            batch_size=self._batch_size(stats),
        )
        if stats is None:
            return snap
        rates, delivered_per_s = self.rates()
        return replace(
            snap,
            stats=stats,
            producers=tuple(ProducerRow.of(pr, rates.get(pr.name)) for pr in stats.producers),
            trainer=None if stats.trainer is None else TrainerFigures.of(stats.trainer, now),
            delivered_per_s=None if delivered_per_s is None else round(delivered_per_s, 2),
            stats_age_s=round(now - self.stats_at, 3),
        )

    def _batch_size(self, stats: StagerStats | None) -> float | None:
        """Rows per batch: their mean over the buckets (rows vary with the bucket), else
        the batch ring's rows; None before either is known."""
        if stats is not None and stats.buckets:
            return sum(shape[0] for shape in stats.buckets) / len(stats.buckets)
        if self.batches is None:
            return None
        return int(self.batches.fields["items"][0][0])

    def places(self) -> np.ndarray:
        """The records of the places in use (one copy: a consistent-enough picture): the
        rows of the batches being filled (and of slots fenced for a stale writer), then
        the spare ring's slots (shared/memory/places.py)."""
        records = [np.array(self.spares.slots)]
        if self.batches is not None:
            states = np.array(self.batches.slots["state"])
            rows = np.array(self.batches.rows).reshape(len(states), -1)
            filling = (states == BatchState.FILLING) | (states == BatchState.FENCED)
            records.insert(0, rows[filling].reshape(-1))
        return np.concatenate(records)

    def _ring_view(self, now: float) -> RingView:
        slots = self.places()
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
                SlotView(k, state.name, _rounded(age), int(rec["item"]), int(rec["producer"]))
            )
        batch_slots = batch_ready = 0
        if self.batches is not None:
            states = np.array(self.batches.slots["state"])
            batch_slots, batch_ready = len(states), int((states == BatchState.SENT).sum())
        return RingView(
            n_slots=len(slots),
            slots=counts,
            slot_bar=state_bar(shown),
            per_slot=tuple(per_slot),
            oldest_grant_s=_rounded(oldest_grant),
            oldest_ready_s=_rounded(oldest_ready),
            grants_by_producer_index=grants_by_producer,
            batch_slots=batch_slots,
            batch_ready=batch_ready,
        )

    def close(self) -> None:
        """Close the socket and unmap; idempotent, never unlinks (we do not own the rings)."""
        self.sub.close()
        self.ctx.term()
        for ring in (self.spares, self.batches):
            if ring is not None:
                ring.close()


def _rounded(age_s: float | None) -> float | None:
    return None if age_s is None else round(age_s, 3)


def write_out(text: str) -> None:
    """The inspector's only terminal output: it is a CLI view, not a log."""
    sys.stdout.write(text)
    sys.stdout.flush()


def log_tail(path: str, lines: int = LOG_LINES) -> list[str]:
    """The last lines of a log file (its last 16 KiB at most); [] if unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def live(insp: Inspector, interval_s: float, record: str | None, log_path: str = "") -> int:
    """Redraw every interval_s until Ctrl-C or the run ends; append snapshots to record;
    show the last lines of the run's log file, when given, under the screen (the run
    writes there instead of to the terminal, so a redraw never wipes a log line)."""
    out = open(record, "a") if record else None  # noqa: SIM115 - closed in finally
    try:
        while True:
            insp.poll_stats(interval_s)
            if not insp.alive():
                write_out(f"\nrun {insp.run_id} ended: its ring is gone\n")
                return 0
            snap = insp.snapshot()
            write_out(CLEAR + render(snap, log_tail(log_path) if log_path else None) + "\n")
            if out is not None:
                out.write(json.dumps(snap.to_dict()) + "\n")
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
    log_path: str = "",
) -> int:
    """Entry of `ringfeed inspect`; returns the exit code."""
    if plot:
        if not recording:
            log.error("--plot needs --from RECORDING (a jsonl file written by --record)")
            return 2
        try:
            plot_recording(recording, plot)
        except MissingExtra as exc:
            log.error("%s", exc)
            return 2
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
            write_out(json.dumps(insp.snapshot().to_dict(), indent=1) + "\n")
            return 0
        return live(insp, interval_s, record, log_path)
    finally:
        insp.close()
