"""The configuration's producers section: the local pool and how a producer behaves.

Part of the one configuration (shared/config/config.py); validates its own keys
(producers.orphan_s against ring.lease_s is a cross-section check:
shared/config/checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ringfeed.shared.config.loader import at_least_one, check


@dataclass(frozen=True)
class ProducersConfig:
    # Producer processes of a local pool.
    workers: int = 2
    # A pool restarts a dead worker at most this many times.
    max_restarts: int = 5
    # Wait before the first restart, doubled on each, seconds.
    restart_backoff_s: float = 0.5
    # Grants a producer holds at once: enough to hide the round trip to the stager.
    # Ring throughput here with 2, 4, 8, 16, 32 (before GRANT/READY carried lists):
    # 6.6k, 8.3k, 11.7k, 14.4k, 14.3k samples/s; 16 also caps what one producer holds.
    credits: int = 16
    # Math-library threads per producer; >1 oversubscribes cores
    # (docs/design.md#hazards-worth-knowing).
    math_threads: int = 1
    # Producers per node with `ringfeed producers --ray` (0 = one per CPU a node offers).
    per_node: int = 0
    # A producer that hears nothing from its stager for this long (after a WELCOME,
    # counting only time it was running: not a SIGSTOP or a suspended VM) exits, seconds.
    # Until then it says HELLO again, backing off to once a minute, and rejoins the run
    # when the stager answers: a network partition or a paused stager heals by itself.
    orphan_s: float = 21600.0

    def __post_init__(self) -> None:
        at_least_one(
            "producers", workers=self.workers, credits=self.credits, math_threads=self.math_threads
        )
        check(self.per_node >= 0, "producers.per_node", "must be >= 0 (0 = one per CPU)")
