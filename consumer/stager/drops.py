"""Messages the stager drops, counted by reason and logged sparingly.

A malformed, oversized, stale or unauthorized message is dropped and counted,
never fatal (docs/design.md#contract-9). Every part of the stager counts
its drops here; the counts reach the stats, stager.json and the inspector.
"""

from __future__ import annotations

import logging
from collections import Counter

from ringfeed.shared.run.stats_record import DropStats

log = logging.getLogger(__name__)


class Drops:
    """Drop counts by reason; the first three of a reason are logged, then every 1000th."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, why: str, detail: str) -> None:
        self.counts[why] += 1
        n = self.counts[why]
        if n <= 3 or n % 1000 == 0:
            log.warning("dropped a %s message (%d so far): %s", why, n, detail)

    def stats(self) -> DropStats:
        """Its part of the stager's stats: the counts so far."""
        return DropStats(dict(self.counts))
