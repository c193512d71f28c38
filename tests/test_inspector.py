"""The inspector: diagnose() on hand-built snapshots, then on real induced stalls."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from consumer.tools.diagnosis import diagnose
from consumer.tools.inspector import Inspector
from scripts.runner import REPO
from tests.runs import Run, rid, shm_segments, small


def _snap(**over: Any) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "has_stats": True,
        "consumer_connected": True,
        "n_slots": 16,
        "slots": {"FREE": 14, "GRANTED": 2, "READY": 0},
        "batch_slots": 3,
        "batch_ready": 0,
        "batch_size": 4,
        "lease_s": 10.0,
        "oldest_grant_s": 0.1,
        "oldest_ready_s": None,
        "producers": [{"name": "p0", "rate_per_s": 20.0, "grants": 2, "silent_s": 0.1}],
        "trainer": {"step": 5, "step_s": 0.01, "wait_s": 0.19},
    }
    snap.update(over)
    return snap


@pytest.mark.parametrize(
    ("over", "stage"),
    [
        ({"has_stats": False}, "starting"),
        ({"consumer_connected": False}, "no-consumer"),
        ({"oldest_grant_s": 12.0}, "stuck-producer"),
        ({"producers": [{"name": "p0", "stalled": True, "silent_s": 11.0}]}, "stuck-producer"),
        ({}, "producers"),
        ({"slots": {"READY": 14, "GRANTED": 2}, "oldest_ready_s": 2.0}, "stager"),
        (
            {"slots": {"READY": 14, "GRANTED": 2}, "oldest_ready_s": 0.5, "oldest_grant_s": 3.0},
            "producers",
        ),
        (
            {"slots": {"READY": 16}, "batch_ready": 3, "trainer": {"step_s": 0.3, "wait_s": 0.0}},
            "trainer",
        ),
        ({"trainer": {}}, "starting"),
    ],
)
def test_diagnose_stages(over: dict[str, Any], stage: str) -> None:
    d = diagnose(_snap(**over))
    assert d.stage == stage, d
    assert d.evidence and d.advice


def test_producers_evidence_quotes_numbers() -> None:
    d = diagnose(_snap())
    assert "95%" in d.evidence[0] and "20.0 samples/s" in d.evidence[1]
    assert "producers.workers" in d.advice


@pytest.mark.parametrize("device", ["producer", "stager"])
def test_advice_fits_a_host_without_gpu(device: str) -> None:
    """No GPU: never advise stager-side mels, never call the limit 'the GPU'."""
    cpu = {"gpus": 0, "features_device": device}
    slow = diagnose(_snap(**cpu))
    assert slow.stage == "producers" and "mels on the GPU" not in slow.advice
    if device == "stager":
        assert "features.device: producer" in slow.advice
    busy = {"slots": {"READY": 16}, "batch_ready": 3, "trainer": {"step_s": 0.3, "wait_s": 0.0}}
    trainer = diagnose(_snap(**cpu, **busy))
    assert trainer.stage == "trainer" and "GPU" not in " ".join(trainer.evidence)
    assert "the trainer's CPU step is the limit" in trainer.evidence[0]


def test_advice_on_a_gpu_host_offers_stager_mels_and_names_the_gpu() -> None:
    gpu = {"gpus": 2, "features_device": "producer"}
    assert "features.device: stager (mels on the GPU)" in diagnose(_snap(**gpu)).advice
    busy = {"slots": {"READY": 16}, "batch_ready": 3, "trainer": {"step_s": 0.3, "wait_s": 0.0}}
    assert "the GPU is the limit" in diagnose(_snap(**gpu, **busy)).evidence[0]


# ---------------------------------------------------------------- real runs


def _stage_after_settling(run: Run, settle_s: float = 4.0) -> tuple[str, dict]:
    """`ringfeed inspect --json` as a user runs it, after the run settled."""
    time.sleep(settle_s)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.cli",
            "inspect",
            "--run-id",
            run.run_id,
            "--json",
            "--config",
            str(run.config),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    return snap["diagnosis"]["stage"], snap


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
        time.sleep(1.0)
        insp = Inspector(run.run_id, str(cfg_path))
        before = (insp.samples.slots.copy(), insp.samples.view("mel").copy())
        for _ in range(5):
            insp.poll_stats(0.2)
            insp.snapshot()
        with pytest.raises(ValueError, match="read-only"):
            insp.samples.slots[0]["state"] = 0
        with pytest.raises(ValueError, match="read-only"):
            insp.samples.view("mel")[0, 0, 0] = 1.0
        after = (insp.samples.slots, insp.samples.view("mel"))
        assert np.array_equal(before[0], after[0]) and np.array_equal(before[1], after[1])
        insp.close()
