"""The epoch plan: plan positions -> (epoch, item), a pure function of seed and epoch.

Positions. The plan is the endless concatenation of epochs; plan position p is
epoch ``p // n_items`` and item ``permutation(seed, epoch)[p % n_items]``. A
cursor is one position, so resuming is O(1) (docs/design.md#contract-4). Used by the stager's
slot manager, and by tests and benchmarks that check what a run delivered.

Shares (several training workers, `ringfeed run --worker K/N`). Every worker's
stager holds the same global plan, batches included (a BucketPlan: with one
bucket when buckets are off), and :class:`SharePlan` keeps the positions of
worker k: rows k, k + N, k + 2N, ... of every global batch. So the global batch
j is the union of the workers' batch j, every worker takes the same bucket at
every step, each worker builds one batch per global batch, and the shares are
disjoint. Positions stay global: a worker's cursor is a global position (the
end of the global batch it last sent), the chief's checkpoint serves every
worker (each starts at its first position at or after it), and resuming stays
O(1). The global plan does not depend on the number of workers, so a resume
with another number continues the same global batches. The remainder: a global
batch with fewer than N items (only an epoch's last, leftover batches can be
that small) is trained by nobody; its items are dropped from that epoch, and
since the permutation changes every epoch, different items each time (logged
at start).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ringfeed.shared.config.loader import ConfigError


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
            # rng.permutation(n) shuffles an int64 arange; shuffling an int32 one gives the
            # same order (the same draws) in half the memory: 40 MB at 10**7 items.
            dtype = np.int32 if self.n_items < 2**31 else np.int64
            perm = np.arange(self.n_items, dtype=dtype)
            rng.shuffle(perm)
            self._perm[epoch] = perm
        return self._perm[epoch]

    def item_at(self, position: int) -> int:
        epoch, index = divmod(position, self.n_items)
        return int(self.permutation(epoch)[index])

    def epoch_of(self, position: int) -> int:
        return position // self.n_items

    def next_owned(self, position: int) -> int:
        """The first position at or after `position` that this plan delivers: every
        one without shares (SharePlan keeps its worker's)."""
        return position


@dataclass(frozen=True)
class Share:
    """Worker `index` of `count` training workers (`ringfeed run --worker K/N`)."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Share:
        """ "K/N" -> Share(K, N); raises ConfigError naming --worker when malformed."""
        k, sep, n = text.partition("/")
        if not (sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
            raise ConfigError(f"--worker {text!r}: write it as K/N with 0 <= K < N, e.g. 0/2")
        return cls(int(k), int(n))

    def run_id(self, base: str) -> str:
        """This worker's own run id (its rings, sockets, run directory): base, or with
        several workers base-wK, so workers can share one host and one file system."""
        return base if self.count == 1 else f"{base}-w{self.index}"

    def chief_run_id(self, run_id: str) -> str:
        """The run id of worker 0, whose checkpoints every worker resumes from."""
        return run_id if self.count == 1 else run_id.removesuffix(f"-w{self.index}") + "-w0"

    def chief_run_ids(self, run_id: str) -> tuple[str, str]:
        """The chief's run id, then the chief's under the other layout (one worker: base;
        several: base-w0): where a run resumed with another number of workers finds its
        checkpoints (consumer/trainer/trainer.py)."""
        chief = self.chief_run_id(run_id)
        return chief, chief.removesuffix("-w0") if self.count > 1 else f"{run_id}-w0"

    def rows(self, global_rows: int) -> int:
        """Rows of a worker's batch for a global batch of `global_rows`: ceil(rows / N)."""
        return -(-global_rows // self.count)


ONE_WORKER = Share()


class SharePlan(EpochPlan):
    """Worker share.index's part of a global plan whose positions form batches
    (a BucketPlan: anything with ``layout(epoch)`` and ``batch_at(position)``)."""

    def __init__(self, global_plan, share: Share) -> None:
        super().__init__(global_plan.n_items, global_plan.seed)
        self.end = global_plan.end
        self.whole, self.share = global_plan, share

    def permutation(self, epoch: int) -> np.ndarray:
        return self.whole.permutation(epoch)

    def batch_at(self, position: int) -> tuple[int, int, int]:
        return self.whole.batch_at(position)

    def owns(self, position: int) -> bool:
        _, first, end = self.whole.batch_at(position)
        offset = position - first
        return end - first >= self.share.count and offset % self.share.count == self.share.index

    def next_owned(self, position: int) -> int:
        """The first position at or after `position` of this worker's share (the plan's
        end if none is left): O(1) within a batch, one step per batch it passes over."""
        k, n = self.share.index, self.share.count
        start = position
        while self.end is None or position < self.end:
            _, first, end = self.whole.batch_at(position)
            if end - first >= n:
                mine = first + k + max(0, -(-(position - first - k) // n)) * n
                if mine < end:
                    return mine
            position = end
            if position - start > 2 * self.n_items:  # a whole epoch without a batch of n
                raise ConfigError(
                    f"--worker: no global batch of epoch {self.epoch_of(start)} has {n} items "
                    f"for the {n} workers (a dataset of {self.n_items}): use fewer workers"
                )
        return self.end

    def remainder(self, epoch: int) -> int:
        """Items of `epoch` in global batches too small to give every worker a row."""
        layout = self.whole.layout(epoch)
        sizes = np.diff(np.append(layout.starts, self.n_items))
        return int(sizes[sizes < self.share.count].sum())


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
