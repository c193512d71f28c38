"""The inspector on real runs: it names the limiting stage of an induced stall, and never
changes the ring it reads."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ringfeed.consumer.tools.inspector import Inspector
from ringfeed.shared.memory.ring import SlotState, shown_state
from tests.support.configs import small
from tests.support.paths import REPO
from tests.support.processes import CLI
from tests.support.runs import Run, rid, shm_segments

# Trainer steps past start-up: by then its data wait and the batch ring are steady.
SETTLED_STEPS = 5


def _inspect_json(run: Run) -> dict[str, Any]:
    """`ringfeed inspect --json` as a user runs it."""
    out = subprocess.run(
        [*CLI, "inspect", "--run-id", run.run_id, "--json", "--config", str(run.config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _stage_after_settling(run: Run) -> tuple[str, dict[str, Any]]:
    """The stage `inspect --json` names once the trainer has taken SETTLED_STEPS steps."""
    seen: list[dict[str, Any]] = []

    def settled() -> bool:
        seen.append(_inspect_json(run))
        return (seen[-1].get("trainer") or {}).get("step", 0) >= SETTLED_STEPS

    run.poll_for(settled, 60, f"{SETTLED_STEPS} trainer steps in `inspect --json`")
    return seen[-1]["diagnosis"]["stage"], seen[-1]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("delay_s", "step_s", "stage"),
    [(0.05, 0.0, "producers"), (0.0, 0.3, "trainer")],
    ids=["slow-producers", "slow-train-step"],
)
def test_inspector_names_the_limiting_stage_of_a_real_run(
    tmp_path: Path, delay_s: float, step_s: float, stage: str
) -> None:
    cfg_path = small(
        tmp_path,
        items=100_000,
        delay_s=delay_s,
        producers={"workers": 1},
        stager={"batch_size": 4, "epochs": 0},
    )
    with Run(cfg_path, rid(), tmp_path) as run:
        run.start("stager")
        run.start("producers")
        run.start("drain", "--step-s", str(step_s))
        run.poll_for(lambda: len(shm_segments(run.run_id)) == 2, 30, "the rings")
        got, snap = _stage_after_settling(run)
        assert got == stage, json.dumps(snap["diagnosis"], indent=1)
        assert snap["diagnosis"]["advice"]
        run.stop()
        assert shm_segments(run.run_id) == []


@pytest.mark.slow
def test_inspector_never_changes_the_ring(tmp_path: Path) -> None:
    # A stopped consumer freezes the run: every slot and field must stay as it was.
    cfg_path = small(tmp_path, items=1000, delay_s=0.0)
    with Run(cfg_path, rid(), tmp_path) as run:
        run.start("stager")
        run.start("producers")
        held = run.client()
        for _ in range(3):  # take every batch slot: the run stops moving
            held.next(timeout_s=30)
        insp = Inspector(run.run_id, str(cfg_path))
        run.poll_for(_stopped_moving(insp), 30, "the rings to stop moving")
        batches, spares = insp.batches, insp.spares
        assert batches is not None
        views = (batches.slots, batches.rows, batches.view("mel"), spares.slots, spares.view("mel"))
        before = [v.copy() for v in views]
        for _ in range(5):
            insp.poll_stats(0.2)
            insp.snapshot().to_dict()
        for ring in (batches, spares):
            with pytest.raises(ValueError, match="read-only"):
                ring.slots[0]["state"] = 0
            with pytest.raises(ValueError, match="read-only"):
                ring.view("mel")[0, 0] = 1.0
        with pytest.raises(ValueError, match="read-only"):
            batches.rows[0]["state"] = 0
        assert all(np.array_equal(a, b) for a, b in zip(before, views, strict=True))
        insp.close()


def _stopped_moving(insp: Inspector) -> Callable[[], bool]:
    """A predicate for poll_for: true once no place is granted or being written and the
    place records are as at the previous call (so the stager grants nothing more)."""
    last: list[np.ndarray] = []

    def still() -> bool:
        places = insp.places()
        busy = any(shown_state(rec) in (SlotState.GRANTED, SlotState.WRITING) for rec in places)
        same = bool(last) and np.array_equal(last[-1], places)
        last[:] = [places]
        return same and not busy

    return still
