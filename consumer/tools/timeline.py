"""The timeline of a recorded run (`ringfeed inspect --plot PNG --from FILE`).

Reads the jsonl that ``inspect --record`` writes, one InspectorSnapshot.to_dict
per refresh (consumer/tools/snapshot.py), into a TimelinePoint each: only what
the plot draws, so recordings of older versions still read. Draws ring
occupancy, data wait, step time and the limiting stage.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ringfeed.shared.config.extras import need_extra

if TYPE_CHECKING:
    from matplotlib.axes import Axes

STAGE_COLORS = {
    "producers": "tab:red",
    "stager": "tab:orange",
    "trainer": "tab:green",
    "stuck-producer": "tab:purple",
    "no-consumer": "tab:gray",
    "starting": "lightgray",
    "stale": "black",
}
OCCUPANCY = {  # place state: its colour, stacked bottom up
    "READY": "tab:green",
    "WRITING": "tab:olive",
    "GRANTED": "tab:blue",
    "FENCED": "tab:purple",
    "FREE": "0.85",
}


@dataclass(frozen=True)
class TimelinePoint:
    """One recorded snapshot as the plot reads it: t (time.time(), s), places per
    state, batch slots ready, the trainer's data-wait fraction and step_s (NaN before its
    first report), and the diagnosed stage."""

    t: float
    run_id: str
    slots: dict[str, int]
    batch_ready: int
    wait_fraction: float
    step_s: float
    stage: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimelinePoint:
        trainer = data.get("trainer") or {}
        wait, step_s = trainer.get("wait_fraction"), trainer.get("step_s")
        return cls(
            t=float(data["t"]),
            run_id=str(data.get("run_id", "")),
            slots=dict(data.get("slots") or {}),
            batch_ready=int(data.get("batch_ready", 0)),
            wait_fraction=np.nan if wait is None else float(wait),
            step_s=np.nan if step_s is None else float(step_s),
            stage=(data.get("diagnosis") or {}).get("stage", "starting"),
        )


def read_recording(recording: str) -> list[TimelinePoint]:
    """The points of a --record jsonl file, in order; ValueError if it holds none."""
    lines = Path(recording).read_text().splitlines()
    points = [TimelinePoint.from_dict(json.loads(line)) for line in lines if line]
    if not points:
        raise ValueError(f"{recording} holds no snapshots: record with `inspect --record`")
    return points


def plot_recording(recording: str, png: str) -> None:
    """Render a --record jsonl file as a timeline PNG (ring occupancy, data wait, step time)."""
    matplotlib = need_extra("matplotlib", "plot", "`ringfeed inspect --plot` draws with it")
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    points = read_recording(recording)
    t = np.array([pt.t - points[0].t for pt in points])
    fig, axes = plt.subplots(
        4, 1, figsize=(10, 7.5), sharex=True, height_ratios=[3, 2, 2, 0.5], layout="constrained"
    )
    _occupancy(axes[0], t, points)
    _trainer(axes[1], axes[2], t, points)
    _stages(axes[3], t, points)
    for ax in axes[:3]:
        ax.grid(alpha=0.3)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _occupancy(ax: Axes, t: np.ndarray, points: list[TimelinePoint]) -> None:
    """Sample slots per state, stacked, and the batch slots ready as a line."""
    stacks = [[pt.slots.get(state, 0) for pt in points] for state in OCCUPANCY]
    ax.stackplot(t, stacks, labels=list(OCCUPANCY), colors=list(OCCUPANCY.values()), step="post")
    ax.plot(
        t, [pt.batch_ready for pt in points], "k-", drawstyle="steps-post", label="batch ring ready"
    )
    ax.set_ylabel("slots")
    ax.set_title(f"ringfeed run {points[0].run_id}: places (rows being filled, spares)")
    ax.legend(loc="upper left", fontsize=8, ncol=6)


def _trainer(wait_ax: Axes, step_ax: Axes, t: np.ndarray, points: list[TimelinePoint]) -> None:
    """The trainer's data wait (%) and step time (ms)."""
    wait_ax.plot(t, [pt.wait_fraction * 100 for pt in points], "tab:red", drawstyle="steps-post")
    wait_ax.set_ylabel("data wait %")
    wait_ax.set_ylim(-5, 105)
    step = np.array([pt.step_s for pt in points])
    step_ax.plot(t, step * 1000, "tab:blue", drawstyle="steps-post")
    step_ax.set_ylabel("step ms")
    finite = step[np.isfinite(step)]  # NaN: steps not reported yet
    step_ax.set_ylim(0, max(finite, default=0.001) * 1250)  # headroom above the line


def _stages(strip: Axes, t: np.ndarray, points: list[TimelinePoint]) -> None:
    """The diagnosed stage of each snapshot as a coloured strip, with its legend."""
    from matplotlib.patches import Rectangle

    ends = [*t[1:], t[-1] + (t[-1] - t[-2] if len(t) > 1 else 1.0)]
    for pt, t0, t1 in zip(points, t, ends, strict=True):
        strip.axvspan(t0, t1, color=STAGE_COLORS.get(pt.stage, "white"), lw=0)
    strip.set_yticks([])
    strip.set_ylabel("limit", rotation=0, ha="right", va="center")
    strip.legend(
        handles=[Rectangle((0, 0), 1, 1, color=c) for c in STAGE_COLORS.values()],
        labels=list(STAGE_COLORS),
        loc="upper center",
        bbox_to_anchor=(0.5, -0.9),
        ncol=6,
        fontsize=8,
    )
    strip.set_xlabel("seconds since the first snapshot")
