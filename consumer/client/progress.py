"""The loader's progress line for a loop of one's own: every N steps, what the example
trainers log (steps/s, the share of the time spent waiting for data, the epoch, the
loss noted), so a user's loop says how it goes without code of its own.

    ringfeed: step 150, epoch 2 (batch 12 of 19), 14.2 steps/s, data wait 3 % (last 50
    steps), loss 1.23

On by default, as a tqdm bar is: `progress_every=0` turns it off. It goes to the
`ringfeed.progress` logger at INFO; a process that configured no logging at all gets a
handler of its own on that logger (stderr), so the line shows without a basicConfig.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from ringfeed.shared.wire import protocol as p

log = logging.getLogger("ringfeed.progress")

# Steps between two progress lines: the example trainers' log_every is 10 on 150 steps;
# a user's loop runs thousands, so one line per 50 steps.
PROGRESS_EVERY = 50


def show_without_logging_setup() -> None:
    """A stderr handler on the progress logger where the process set up no logging."""
    if logging.getLogger().handlers or log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


class Progress:
    """Counts steps and data waits; logs a line every `every` steps (0: never)."""

    def __init__(self, every: int = PROGRESS_EVERY) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"progress_every={every!r}: steps between lines, 0 for none")
        self.every = every
        self.steps = 0
        self.since: float | None = None  # when the window began
        self.waited_s = 0.0

    def step(self, now: float, wait_s: float, meta: p.BatchReady, loader: Any) -> None:
        """A batch was handed out at `now` after waiting wait_s for it."""
        if not self.every:
            return
        if self.since is None:  # the first batch: the window starts once it is there
            self.since = now
            show_without_logging_setup()
            return
        self.steps += 1
        self.waited_s += wait_s
        if self.steps < self.every:
            return
        took_s = max(now - self.since, 1e-9)
        of = ""
        if loader._plan is not None:  # counted where len() was asked: no plan made here
            of = f" of {len(loader)}"
        log.info(
            "ringfeed: step %d, epoch %d (batch %d%s), %.1f steps/s, data wait %.0f %% "
            "(last %d steps), loss %.4g",
            meta.batch_index + 1,
            meta.first_epoch,
            loader.batches_this_pass,
            of,
            self.steps / took_s,
            100 * self.waited_s / took_s,
            self.steps,
            loader.last_loss,
        )
        self.steps, self.since, self.waited_s = 0, now, 0.0
