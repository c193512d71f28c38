"""Where a consumer stands in the plan: the cursor a checkpoint keeps.

The same record as the TensorFlow trainer's checkpoint cursor
(consumer/trainer/checkpoint.py): ``{"position", "batch_index", "epoch", "seed",
"plan"}``, plain ints and strings, so any checkpointer can save it (torch.save, orbax's
JSON, a sidecar file). After a batch, ``position`` is its ``next_position``: every plan
position before it was delivered or skipped, so a consumer that starts there sees the
batches an uninterrupted one would have seen (docs/design.md#contract-4). ``plan`` is
the stager's plan fingerprint (shared/run/fingerprint.py): a cursor of another plan
(another corpus, seed, buckets or length table) is refused with what differs, as the
stager refuses the trainer's resume. With several training workers the position is a
global one and the chief's cursor serves every worker (shared/run/share.py).

Used by the PyTorch and JAX loaders (consumer/client/torch_loader.py, jax_loader.py);
no framework here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ringfeed.shared.config import Config
from ringfeed.shared.run.fingerprint import plan_changes
from ringfeed.shared.wire import protocol as p

KEYS = ("position", "batch_index", "epoch", "seed", "plan")


class PlanMismatch(ValueError):
    """A cursor of another plan than the stager's: the message says what differs."""


@dataclass(frozen=True)
class Cursor:
    """The next batch a consumer takes: its plan position and batch index, the epoch
    of the last batch taken, the seed, and the plan fingerprint ({}: not yet joined)."""

    position: int = 0
    batch_index: int = 0
    epoch: int = 0
    seed: int = 0
    plan: dict[str, str] = field(default_factory=dict)

    @classmethod
    def fresh(cls, cfg: Config) -> Cursor:
        """The start of the plan of cfg's seed."""
        return cls(seed=cfg.stager.seed)

    def after(self, meta: p.BatchReady, plan: dict[str, str]) -> Cursor:
        """The cursor once the batch `meta` was taken, in the plan `plan`."""
        return Cursor(meta.next_position, meta.batch_index + 1, meta.epoch, self.seed, dict(plan))

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's record: JSON scalars and a dict of strings."""
        return {
            "position": self.position,
            "batch_index": self.batch_index,
            "epoch": self.epoch,
            "seed": self.seed,
            "plan": dict(self.plan),
        }

    @classmethod
    def from_dict(cls, state: Any, cfg: Config) -> Cursor:
        """A saved cursor, checked; ValueError naming the key when it is not one, and
        PlanMismatch when its seed is not cfg's (the plan would differ everywhere)."""
        if not isinstance(state, dict) or "position" not in state:
            raise ValueError(
                f"not a ringfeed cursor: {type(state).__name__} without 'position' (a loader's "
                "state_dict() or a trainer checkpoint's cursor has "
                f"{', '.join(KEYS)})"
            )
        for key in ("position", "batch_index", "epoch", "seed"):
            value = state.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"cursor[{key!r}] = {value!r}: must be an integer >= 0")
        plan = state.get("plan") or {}
        if not isinstance(plan, dict) or not all(isinstance(v, str) for v in plan.values()):
            raise ValueError(f"cursor['plan'] = {plan!r}: must map plan parts to hashes")
        seed = state.get("seed", cfg.stager.seed)
        if seed != cfg.stager.seed:
            raise PlanMismatch(
                f"the cursor is of a plan with seed {seed}, this run's stager.seed is "
                f"{cfg.stager.seed}: resuming it would give items twice or never; load the "
                "cursor into a run of its own config"
            )
        return cls(
            state["position"], state.get("batch_index", 0), state.get("epoch", 0), seed, dict(plan)
        )

    def check_plan(self, ours: dict[str, str]) -> None:
        """PlanMismatch naming the parts (dataset index, seed, buckets, length table,
        balance) where this cursor's plan is not `ours`, the stager's; a cursor without
        a plan (a fresh start) fits every plan."""
        changed = plan_changes(ours, self.plan) if self.plan and ours else []
        if changed:
            raise PlanMismatch(
                f"the cursor is of another plan than the stager's ({', '.join(changed)} "
                "differ): resuming it would give items twice or never; restore it into a run "
                "of its own corpus and config, or start this run from a fresh cursor"
            )
