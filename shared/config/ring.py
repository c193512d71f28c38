"""The configuration's ring section: the rings' sizes and the rules of a grant.

Part of the one configuration (shared/config/config.py); validates its own keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringfeed.shared.config.loader import at_least_one, check


@dataclass(frozen=True)
class RingConfig:
    # Batches the producers fill ahead of the consumer, in place (0 = enough for every
    # local producer's credits, as far as both rings fit in 90 % of /dev/shm:
    # docs/design.md#the-look-ahead).
    lookahead: int = 0
    # Places of the spare ring, for what cannot be written where it is delivered: second
    # grants (backups, audits), retries of a row its producer may still write, stager
    # mels' waveforms (0 = twice producers.credits, or the look-ahead's rows).
    spares: int = 0
    # A grant with no READY within this long comes back (and bounds one sample's work), seconds.
    lease_s: float = 10.0
    # How often producers say they are alive, seconds.
    heartbeat_s: float = 1.0
    # An item whose lease expires this many times is skipped with a reason.
    max_item_attempts: int = 3
    # Rejected messages in 10 minutes that get a peer refused for the run (0 = never).
    max_strikes: int = 3
    max_producers_per_peer: int = 64  # joined at once per CURVE key, tcp host, local pool
    # Share of a remote producer's samples a local producer computes again to check them
    # (docs/faults-and-security.md#audits); every remote SKIP is checked.
    audit_fraction: float = 0.01
    # Each remote peer's first samples that are all checked so.
    audit_first: int = 8

    def __post_init__(self) -> None:
        at_least_one(
            "ring",
            max_item_attempts=self.max_item_attempts,
            max_producers_per_peer=self.max_producers_per_peer,
        )
        check(self.lookahead >= 0, "ring.lookahead", "must be >= 0 (0 = from the producers)")
        check(self.spares >= 0, "ring.spares", "must be >= 0 (0 = from the producers)")
        check(self.heartbeat_s > 0, "ring.heartbeat_s", "must be > 0")
        check(
            self.lease_s >= 2 * self.heartbeat_s,
            "ring.lease_s",
            f"{self.lease_s} s must be at least 2 x ring.heartbeat_s={self.heartbeat_s} s, "
            "or live producers lose their grants",
        )
        check(self.max_strikes >= 0, "ring.max_strikes", "must be >= 0 (0 = never refuse a peer)")
        check(0 <= self.audit_fraction <= 1, "ring.audit_fraction", "must be within [0, 1]")
        check(self.audit_first >= 0, "ring.audit_first", "must be >= 0 (0 = none always)")
