"""The epoch plan: plan positions -> (epoch, item), a pure function of seed and epoch.

Positions. The plan is the endless concatenation of epochs; plan position p is
epoch ``p // n_items`` and item ``permutation(seed, epoch)[p % n_items]``. A
cursor is one position, so resuming is O(1) (README, "Design", contract 4). Used by the stager's
slot manager, and by tests and benchmarks that check what a run delivered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.schema import ConfigError


class EpochPlan:
    """Plan positions -> (epoch, item): a fresh permutation per epoch from the seed."""

    def __init__(self, n_items: int, seed: int, epochs: int = 0) -> None:
        if n_items <= 0:
            raise ConfigError(
                "data.path: the dataset has no usable items; see quarantine.jsonl for why"
            )
        self.n_items = n_items
        self.seed = seed
        self.end = epochs * n_items if epochs > 0 else None
        self._perm: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm:
            if len(self._perm) > 4:
                self._perm.pop(min(self._perm))
            rng = np.random.default_rng([self.seed, epoch])
            self._perm[epoch] = rng.permutation(self.n_items)
        return self._perm[epoch]

    def item_at(self, position: int) -> int:
        epoch, index = divmod(position, self.n_items)
        return int(self.permutation(epoch)[index])

    def epoch_of(self, position: int) -> int:
        return position // self.n_items


@dataclass(frozen=True)
class Event:
    """A finished plan position: kind is 'sample' (slot holds it) or 'skip' (with the
    reason, the stage that gave up on it and, from a producer, the input's path)."""

    kind: str
    position: int
    item: int
    slot: int = -1
    reason: str = ""
    stage: str = ""
    path: str = ""
