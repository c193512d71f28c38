"""The timeline of a recorded run (`ringfeed inspect --plot PNG --from FILE`).

Reads the jsonl that ``inspect --record`` writes, one snapshot per refresh,
and draws ring occupancy, data wait, step time and the limiting stage.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

STAGE_COLORS = {
    "producers": "tab:red",
    "stager": "tab:orange",
    "trainer": "tab:green",
    "stuck-producer": "tab:purple",
    "no-consumer": "tab:gray",
    "starting": "lightgray",
}


def plot_recording(recording: str, png: str) -> None:
    """Render a --record jsonl file as a timeline PNG (ring occupancy, data wait, step time)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    snaps = [json.loads(line) for line in Path(recording).read_text().splitlines() if line]
    if not snaps:
        raise ValueError(f"{recording} holds no snapshots: record with `inspect --record`")
    t = np.array([s["t"] - snaps[0]["t"] for s in snaps])
    fig, axes = plt.subplots(
        4, 1, figsize=(10, 7.5), sharex=True, height_ratios=[3, 2, 2, 0.5], layout="constrained"
    )
    occ = axes[0]
    names = ("READY", "WRITING", "GRANTED", "FENCED", "FREE")
    colors = ("tab:green", "tab:olive", "tab:blue", "tab:purple", "0.85")
    stacks = [[s["slots"].get(n, 0) for s in snaps] for n in names]
    occ.stackplot(t, stacks, labels=names, colors=colors, step="post")
    occ.plot(t, [s["batch_ready"] for s in snaps], "k-", drawstyle="steps-post",
             label="batch ring ready")  # fmt: skip
    occ.set_ylabel("slots")
    occ.set_title(f"ringfeed run {snaps[0]['run_id']}: sample ring occupancy")
    occ.legend(loc="upper left", fontsize=8, ncol=6)
    trainers = [s.get("trainer") or {} for s in snaps]
    wait = [tr.get("wait_fraction", np.nan) for tr in trainers]
    axes[1].plot(t, np.array(wait, float) * 100, "tab:red", drawstyle="steps-post")
    axes[1].set_ylabel("data wait %")
    axes[1].set_ylim(-5, 105)
    step = [tr.get("step_s", np.nan) for tr in trainers]
    axes[2].plot(t, np.array(step, float) * 1000, "tab:blue", drawstyle="steps-post")
    axes[2].set_ylabel("step ms")
    finite = [v for v in step if v == v]  # NaN != NaN: steps not reported yet
    axes[2].set_ylim(0, max(finite, default=0.001) * 1250)  # headroom above the line
    strip = axes[3]
    ends = [*t[1:], t[-1] + (t[-1] - t[-2] if len(t) > 1 else 1.0)]
    for s, t0, t1 in zip(snaps, t, ends, strict=True):
        stage = s.get("diagnosis", {}).get("stage", "starting")
        strip.axvspan(t0, t1, color=STAGE_COLORS.get(stage, "white"), lw=0)
    strip.set_yticks([])
    strip.set_ylabel("limit", rotation=0, ha="right", va="center")
    strip.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in STAGE_COLORS.values()],
        labels=list(STAGE_COLORS),
        loc="upper center",
        bbox_to_anchor=(0.5, -0.9),
        ncol=6,
        fontsize=8,
    )
    strip.set_xlabel("seconds since the first snapshot")
    for ax in axes[:3]:
        ax.grid(alpha=0.3)
    fig.savefig(png, dpi=100)
    plt.close(fig)
