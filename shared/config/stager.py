"""The configuration's stager section: batches, the epoch plan, length buckets and
balanced epochs. Part of the one configuration (shared/config/config.py); validates
its own keys (buckets against features.max_frames: shared/config/checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ringfeed.shared.config.loader import at_least_one, check

# Auto buckets are at least max_frames // this long, so a batch's rows are bounded.
MIN_BUCKET_FRACTION = 8
# Each bucket is one more compilation of the train step.
MAX_BUCKETS = 16


@dataclass(frozen=True)
class BalanceConfig:
    # Balanced epochs (docs/plans.md#balanced-epochs; consumer/stager/plan/balance.py): off, or
    # the groups whose share of every epoch is set, without replacement.
    by: Literal["off", "language", "speaker"] = "off"
    # Group g weighs weights[g] x (its clips) ** temperature: 1 = as in the data, 0 =
    # uniform (every group the same share), between flattens (0.3 as in mT5).
    temperature: float = 1.0
    # Multipliers by group name (a language code or a speaker name); unnamed groups 1.
    weights: dict[str, float] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        return self.by != "off"

    def __post_init__(self) -> None:
        if not self.on:
            check(
                not self.weights,
                "stager.balance.weights",
                "needs stager.balance.by (language or speaker)",
            )
            return
        check(
            0.0 <= self.temperature <= 1.0,
            "stager.balance.temperature",
            f"must be in [0, 1] (1: as in the data, 0: uniform), got {self.temperature}",
        )
        for name, weight in self.weights.items():
            check(
                0.0 < weight < 1e6,
                f"stager.balance.weights.{name}",
                f"must be a number > 0 and < 1e6 (a multiplier; 1 is the default), got {weight}",
            )


@dataclass(frozen=True)
class StagerConfig:
    # Rows per batch (without buckets).
    batch_size: int = 32
    # Batches staged ahead of the trainer (3: triple buffering).
    batch_slots: int = 3
    # Batches in plan order (exact resume); false: in the order samples finish.
    deterministic: bool = True
    # Seed of the epoch plan (the shuffle of each epoch).
    seed: int = 1234
    # 0 = run until stopped.
    epochs: int = 0
    # Length buckets (docs/plans.md#length-buckets): the mel-frame lengths of the batch
    # shapes the model sees, ascending, the largest = features.max_frames. Each bucket's
    # batch holds batch_frames // length rows. () = one fixed shape [batch_size,
    # max_frames]: the default, as a model must accept several shapes to use buckets.
    buckets: tuple[int, ...] = ()
    # > 0 (with buckets unset): that many buckets, from the length table's quantiles.
    auto_buckets: int = 0
    # Mel frames per batch (rows x bucket length). 0 = batch_size x max_frames: no
    # bucket's batch is larger than the fixed shape's.
    batch_frames: int = 0
    balance: BalanceConfig = field(default_factory=BalanceConfig)
    # With no consumer for this long (none came, or its process is gone: a user loop
    # that crashed), the stager ends the run with exit code 6 and says so, seconds
    # (0 = wait for one forever).
    consumer_wait_s: float = 600.0

    @property
    def bucketed(self) -> bool:
        return bool(self.buckets) or self.auto_buckets > 0

    def __post_init__(self) -> None:
        at_least_one("stager", batch_size=self.batch_size, batch_slots=self.batch_slots)
        check(self.batch_slots >= 2, "stager.batch_slots", "must be >= 2 (3 = triple buffering)")
        check(self.epochs >= 0, "stager.epochs", "must be >= 0 (0 = until stopped)")
        check(
            self.consumer_wait_s >= 0,
            "stager.consumer_wait_s",
            "must be >= 0 seconds (0 = wait for a consumer forever)",
        )
        check(
            self.batch_frames >= 0,
            "stager.batch_frames",
            "must be >= 0 (0 = batch_size x max_frames)",
        )
        check(
            0 <= self.auto_buckets <= MAX_BUCKETS,
            "stager.auto_buckets",
            f"must be 0..{MAX_BUCKETS}",
        )
        check(len(self.buckets) <= MAX_BUCKETS, "stager.buckets", f"at most {MAX_BUCKETS} buckets")
        if self.bucketed:
            self._check_buckets()
        if self.balance.on:
            check(
                self.deterministic,
                "stager.deterministic",
                "balanced epochs need deterministic: true (each batch is a fixed part of the plan)",
            )

    def _check_buckets(self) -> None:
        check(
            not (self.buckets and self.auto_buckets),
            "stager.auto_buckets",
            "set stager.buckets or stager.auto_buckets, not both",
        )
        check(
            self.deterministic,
            "stager.deterministic",
            "length buckets need deterministic: true (each batch is a fixed part of the plan)",
        )
        if self.buckets:
            check(
                list(self.buckets) == sorted(set(self.buckets)) and self.buckets[0] >= 1,
                "stager.buckets",
                "must be distinct positive frame counts in ascending order, got "
                f"{list(self.buckets)}",
            )

    @property
    def n_shapes(self) -> int:
        """Batch shapes the model may see: one per bucket (auto: at most that many)."""
        return len(self.buckets) or self.auto_buckets or 1
