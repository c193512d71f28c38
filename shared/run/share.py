"""A training worker's share of the global plan (`ringfeed run --worker K/N`).

Every worker's stager holds the same global plan, batches included (one bucket of
the fixed shape when buckets are off), and keeps the positions of its share: rows
k, k + N, k + 2N, ... of every global batch (plan.py, Plan.owns and next_owned).
So the global batch j is the union of the workers' batch j, every worker takes the
same bucket at every step, each worker builds one batch per global batch, and the
shares are disjoint. Positions stay global: a worker's cursor is a global position
(the end of the global batch it last sent), the chief's checkpoint serves every
worker (each starts at its first position at or after it), and resuming stays O(1).
The global plan does not depend on the number of workers, so a resume with another
number continues the same global batches. The remainder: a global batch with fewer
than N items (only an epoch's last, leftover batches can be that small) is trained
by nobody; its items are dropped from that epoch, and since the order changes every
epoch, different items each time (logged at start).

Imported by the trainer and the command line too, for the run ids: nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringfeed.shared.config.loader import ConfigError


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

    def base_run_id(self, run_id: str) -> str:
        """The run's id without this worker's suffix: the run directory of what every
        worker of the run shares (its quarantine, consumer/stager/quarantine.py)."""
        return run_id if self.count == 1 else run_id.removesuffix(f"-w{self.index}")

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
