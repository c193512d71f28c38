"""The `--plot PATH` of the benchmarks: their result as horizontal bars, one PNG.

Called by benchmarks/ring_throughput.py, peers.py, buckets.py and balance.py after
they print their table; the images go on docs/benchmarks.md. Each image names the
command and the date that made it, so a figure on the page says which run it is.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# The bars of ringfeed's own variants stand out; every other bar is a peer or a limit.
OURS, PEERS = "tab:blue", "0.6"


def run_label(script: str) -> str:
    """'python benchmarks/x.py ARGS, DATE, N cores': the run an image comes from."""
    args = list(sys.argv[1:])
    if "--plot" in args:  # the image's own path says nothing about the run
        i = args.index("--plot")
        del args[i : i + 2]
    today = datetime.date.today().isoformat()
    return f"benchmarks/{script} {' '.join(args)}".strip() + f", {today}, {os.cpu_count()} cores"


def draw_bars(
    path: str | Path,
    title: str,
    panels: Sequence[tuple[str, Mapping[str, float]]],
    run: str,
    log_x: Sequence[bool] = (),
    ours: Sequence[str] = (),
) -> None:
    """One panel per (x label, {bar label: value}) side by side, bars top to bottom in
    the mapping's order, each with its value written at its end; `run` under the title.
    A bar named in `ours`, or whose label starts with "ringfeed", is drawn in OURS; every
    panel has the same bar labels (they are written once, on the left)."""
    labels = list(panels[0][1])[::-1]
    assert all(list(values)[::-1] == labels for _, values in panels), "panels differ in bars"
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.2 * len(panels) + 1.8, 0.45 * len(labels) + 1.5), squeeze=False
    )
    for i, (ax, (xlabel, values)) in enumerate(zip(axes[0], panels, strict=True)):
        numbers = [values[k] for k in labels]
        colors = [OURS if k in ours or k.startswith("ringfeed") else PEERS for k in labels]
        ax.barh(labels, numbers, color=colors)
        log = i < len(log_x) and log_x[i]
        if log:
            ax.set_xscale("log")
        top = max(numbers)
        ax.set_xlim(min(numbers) / 2 if log else 0, top * (8 if log else 1.3))
        for y, v in enumerate(numbers):
            ax.text(v, y, f" {v:,.3g}" if v < 10 else f" {v:,.0f}", va="center", fontsize=8)
        ax.set_xlabel(xlabel)
        if i:
            ax.set_yticklabels([])
    fig.suptitle(title, fontsize=11)
    fig.text(0.5, 0.005, run, ha="center", va="bottom", fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.04, 1, 1), w_pad=2.5)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"plot: {path}")


def draw_screen(path: str | Path, text: str, run: str) -> None:
    """A terminal screen as a PNG: `text` in a monospace font on a dark background, the
    `run` that made it under it (the inspector's screen on docs/inspector.md)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = text.splitlines()
    width = max(len(line) for line in lines)
    fig = plt.figure(figsize=(0.075 * width + 0.4, 0.155 * (len(lines) + 2) + 0.1))
    fig.patch.set_facecolor("#1e1e1e")
    fig.text(0.01, 0.99, text, family="monospace", size=9, color="#e0e0e0", va="top")
    fig.text(0.01, 0.01, run, size=7, color="0.6", va="bottom")
    fig.savefig(path, dpi=110, facecolor=fig.get_facecolor())
    plt.close(fig)
