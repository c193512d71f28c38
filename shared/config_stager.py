"""The configuration's stager section: batches, the epoch plan, length buckets and
balanced epochs. Part of the one configuration (shared/config.py, which holds it in
Config and validates it with the rest), kept apart as shared/config_corpus.py is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class BalanceConfig:
    # Balanced epochs (README, "Balanced epochs"; consumer/stager/balance.py): off, or
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
    # Length buckets (README, "Length buckets"): the mel-frame lengths of the batch
    # shapes the model sees, ascending, the largest = features.max_frames. Each bucket's
    # batch holds batch_frames // length rows. () = one fixed shape [batch_size,
    # max_frames]: the default, as a model must accept several shapes to use buckets.
    buckets: tuple[int, ...] = ()
    # > 0 (with buckets unset): that many buckets, from the length manifest's quantiles.
    auto_buckets: int = 0
    # Mel frames per batch (rows x bucket length). 0 = batch_size x max_frames: no
    # bucket's batch is larger than the fixed shape's.
    batch_frames: int = 0
    balance: BalanceConfig = field(default_factory=BalanceConfig)

    @property
    def bucketed(self) -> bool:
        return bool(self.buckets) or self.auto_buckets > 0

    @property
    def n_shapes(self) -> int:
        """Batch shapes the model may see: one per bucket (auto: at most that many)."""
        return len(self.buckets) or self.auto_buckets or 1
