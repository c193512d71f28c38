"""The inspector's live screen: one InspectorSnapshot as text (`ringfeed inspect`).

:func:`render` is called by the inspector's live loop (consumer/tools/inspector.py)
once per refresh; it reads a :class:`consumer.tools.snapshot.InspectorSnapshot`
and returns the screen with ANSI bold only (no curses); the loop clears the
terminal with CLEAR before writing it.
"""

from __future__ import annotations

from ringfeed.consumer.tools.diagnosis import STATS_STALE_S, trainer_stale
from ringfeed.consumer.tools.snapshot import InspectorSnapshot, TrainerFigures
from ringfeed.shared.run.stats_record import MAX_LISTED_PRODUCERS, StagerStats

BOLD, RESET, CLEAR = "\x1b[1m", "\x1b[0m", "\x1b[H\x1b[2J"


def _fmt(value: float | None, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _padding_text(stats: StagerStats | None) -> str:
    """'  padding: 93% of frames, 81% of tokens real (4 shapes)', or ''."""
    if stats is None or stats.padding_efficiency.frames is None:
        return ""
    pad = stats.padding_efficiency
    shapes = len(stats.buckets) or 1
    return (
        f"  padding: {pad.frames:.0%} of frames, {_fmt(pad.text, '.0%')} of tokens real "
        f"({shapes} shape{'s' if shapes > 1 else ''})"
    )


def _title(snap: InspectorSnapshot) -> str:
    s = snap.stats
    if s is None:
        return f"ringfeed inspect  run {snap.run_id}  uptime - s  epoch -"
    age = snap.stats_age_s
    stale = f"  STATS {age:.0f} s OLD" if age is not None and age > STATS_STALE_S else ""
    within = s.cursor - s.epoch * s.n_items
    where = (
        f"epoch {s.epoch}, item {within}/{s.n_items} of it (plan position {s.cursor})"
        if 0 <= within <= s.n_items
        else f"epoch {s.epoch}, plan position {s.cursor}"
    )
    return f"ringfeed inspect  run {snap.run_id}  uptime {s.uptime_s:.0f} s  {where}{stale}"


def _ring_lines(snap: InspectorSnapshot) -> list[str]:
    """The title, the diagnosis in bold, both rings and any notes."""
    stats, ring, d = snap.stats, snap.ring, snap.diagnosis
    return [
        _title(snap),
        f"{BOLD}>> {d.stage.upper()}: {'; '.join(d.evidence[:2])}{RESET}",
        f"   advice: {d.advice}",
        "",
        f"places  [{ring.slot_bar}]  "
        + " ".join(f"{k}={v}" for k, v in ring.slots.items() if v)
        + f"  oldest grant {_fmt(ring.oldest_grant_s, '.1f')} s",
        f"batches [{'B' * ring.batch_ready}{'.' * (ring.batch_slots - ring.batch_ready)}]"
        f"  {ring.batch_ready}/{ring.batch_slots} waiting for the trainer" + _padding_text(stats),
        *(f"note: {note}" for note in snap.notes),
    ]


def _producer_lines(snap: InspectorSnapshot, stats: StagerStats) -> list[str]:
    """One line per listed producer: its rate, grants, silence, cache hits, state, host."""
    lines = [
        "",
        f"{'producer':24s} {'rate/s':>8s} {'grants':>6s} {'silent':>7s} {'cache':>6s}  "
        f"{'state':7s} where",
    ]
    for pr in snap.producers:
        state = "STALLED" if pr.stalled else ("fenced" if pr.fenced else "ok")
        lines.append(
            f"{pr.name[:24]:24s} {_fmt(pr.rate_per_s, '8.1f'):>8s} "
            f"{pr.grants:6d} {pr.silent_s:6.1f}s "
            f"{_fmt(pr.cache_hit_frac, '.0%'):>6s}  {state:7s} {pr.where}"
        )
    unlisted = stats.producers_unlisted.count
    if unlisted:
        lines.append(f"... and {unlisted} more (the stats list {MAX_LISTED_PRODUCERS})")
    if not snap.producers:
        lines.append("(no producers connected)")
    return lines


def _trainer_lines(snap: InspectorSnapshot, stats: StagerStats) -> list[str]:
    """The trainer's last report with its rates, then the stager's counters."""
    report, figures = stats.trainer, snap.trainer or TrainerFigures()
    step, step_s = (report.step, report.step_s) if report is not None else (None, None)
    c = stats.counters
    dropped = ", ".join(f"{k}={v}" for k, v in stats.dropped.items()) or "none"
    loss = report.loss if report is not None and report.loss else None  # drain: none
    return [
        "",
        f"trainer: step {_fmt(step, 'd')}  loss {_fmt(loss, '.4f')}  "
        f"step {_fmt(step_s, '.3f')} s  data wait {_fmt(figures.wait_fraction, '.0%')}  "
        f"{_fmt(figures.samples_per_s, '.1f')} samples/s, "
        f"{_fmt(figures.frames_per_s, '.0f')} true frames/s  "
        f"last report {_fmt(figures.age_s, '.1f')} s ago"
        + (" (stale)" if trainer_stale(snap) else "")
        + ("" if stats.consumer_connected else "  (no consumer connected)"),
        f"counters: delivered {c.get('delivered', 0)} ({_fmt(snap.delivered_per_s, '.1f')}"
        f"/s)  skipped {c.get('skipped', 0)}  reclaimed {c.get('reclaimed', 0)}  "
        f"restarts {c.get('restarts', 0)}  pauses {c.get('pauses', 0)}  "
        + (f"forgotten {c['forgotten']}  " if c.get("forgotten") else "")
        + f"dropped {dropped}  crashes {len(stats.crashes)}",
        *_shard_lines(stats),
    ]


def _shard_lines(stats: StagerStats) -> list[str]:
    """The shard cache's line, when producers read tar shards from object storage."""
    shards = stats.shard_cache()
    if not shards:
        return []
    reads = shards["hits"] + shards["fetched"]
    hit = f"{shards['hits'] / reads:.0%}" if reads else "-"
    return [
        f"shard cache: {shards['hits']} hits, {shards['fetched']} shards fetched "
        f"({shards['bytes_fetched'] / 2**20:.1f} MiB), hit rate {hit}, "
        f"{shards['retries']} retries"
    ]


def render(snap: InspectorSnapshot, log_tail: list[str] | None = None) -> str:
    """The live screen as text (ANSI bold only); one screen, called once per refresh.
    log_tail: the last lines of the run's log (`inspect --log FILE`), shown under it."""
    lines = _ring_lines(snap)
    if snap.stats is not None:
        lines += _producer_lines(snap, snap.stats) + _trainer_lines(snap, snap.stats)
    if log_tail:
        lines += ["", "log:", *(f"  {line[:160]}" for line in log_tail)]
    lines.append("\n(Ctrl-C to quit)")
    return "\n".join(lines)
