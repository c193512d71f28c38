"""The trainer in real runs: stager, producers and trainer as separate processes.

Shrunken configs so each run takes seconds on 2 cores; the shape of the run
(processes, rings, sockets, checkpoints) is the real one.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from ringfeed.consumer.devices import count_gpus
from tests.support.configs import BUCKETS, SYNTHETIC, write_config
from tests.support.fault_sources import inject_faults
from tests.support.paths import REPO
from tests.support.plan_walk import trained, uninterrupted
from tests.support.runs import Run, batch_records, rid, shm_segments

pytestmark = pytest.mark.slow

# A line of a CUDA error in a process's log: TensorFlow's C++ lines name their source
# file (cuda_platform.cc, cuda_executor.cc, ...), the driver's errors say cuInit or CUDA.
CUDA_ERROR = re.compile(r"^.*(?:cuInit|CUDA error|CUDA_ERROR|cuda_\w+\.cc).*$", re.M)


def test_real_run_on_ljspeech_mini_learns(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {
            "data": {"path": str(REPO / "data" / "ljspeech-mini")},
            "features": {
                "max_frames": 128,
                "on_too_long": "truncate",
                "cache_dir": str(tmp_path / "cache"),
            },
            "text": {"max_text_len": 64},
            "stager": {"batch_size": 4},
            "model": {"kwargs": {"d_model": 32, "n_layers": 1}},
            "train": {
                "steps": 30,
                "log_every": 5,
                "checkpoint_every": 10,
                "mixed_precision": False,
                "learning_rate": 3e-3,
            },
            "producers": {"workers": 1},
        },
    )
    with Run(config, rid("e2e"), tmp_path) as run:
        run.start_all()
        codes = run.wait_all(timeout_s=120)
        assert codes == {"stager": 0, "producers": 0, "trainer": 0}, run.logs()
        summary = run.json("summary.json")
        assert summary["steps"] == 30
        assert summary["final_loss"] < summary["first_loss"], summary
        assert summary["trace_count"] == 1
        assert summary["delivered"] > 0 and summary["skipped"] == 0
        assert (run.dir / "checkpoints" / "ckpt-30.index").exists()
        assert shm_segments(run.run_id) == []
        # A CPU trainer uses every core by default; the OS shares them with producers.
        logs = run.logs(tail=1_000_000)
        assert f"(cpu, {os.cpu_count()} CPU threads," in logs
        # A host without a GPU (CI's) says so, and prints no CUDA error. TensorFlow's failed
        # probe ("failed call to cuInit", cuda_platform.cc) is expected there: quieted by
        # TF_CPP_MIN_LOG_LEVEL once absl's log is set up, but on a loaded host the probe
        # can come first, and absl prints every line before its set-up (TensorFlow's race,
        # not ours): that one line may show, no other.
        if count_gpus()[0] == 0:
            assert "no GPU found" in logs
            errors = [e for e in CUDA_ERROR.findall(logs) if "failed call to cuInit" not in e]
            assert not errors, errors


def resumable_config(tmp_path: Path, lengths: str) -> Path:
    """16 steps, a checkpoint every 4, every batch logged; fixed shapes or buckets."""
    over = BUCKETS if lengths == "buckets" else {"data": SYNTHETIC["data"]}
    train = {"steps": 16, "checkpoint_every": 4, "log_every": 4, "jit_compile": False}
    raw = (
        SYNTHETIC
        | over
        | {
            "features": SYNTHETIC["features"] | {"cache_dir": str(tmp_path / "cache")},
            "train": train | {"log_batches": True},
        }
    )
    config = write_config(tmp_path, raw)
    inject_faults(config, delay_s=0.02)
    return config


def kill_after_the_first_checkpoint(b: Run) -> None:
    """SIGKILL run b's trainer after its first checkpoint, then stop its stager and
    producers (each exits 0)."""
    # TensorFlow writes its "checkpoint" state file last: only then is ckpt-4 restorable.
    # (Polling for ckpt-4.index raced the save and sometimes killed it half-way.)
    b.poll_for(lambda: (b.dir / "checkpoints" / "checkpoint").exists(), what="the first checkpoint")
    b.signal("trainer", signal.SIGKILL)
    b.wait("trainer", 10)
    b.signal("stager")
    b.signal("producers")
    assert b.wait("stager", 10) == 0 and b.wait("producers", 10) == 0, b.logs()


def resumed(config: Path, tmp_path: Path) -> tuple[dict, dict[int, dict]]:
    """A run of config whose trainer is SIGKILLed after its first checkpoint, stopped,
    and launched again under the same run id: its summary.json and step -> batch
    record."""
    with Run(config, rid("res"), tmp_path) as b:
        b.start_all()
        kill_after_the_first_checkpoint(b)
        b.start_all()
        assert b.wait_all() == {"stager": 0, "producers": 0, "trainer": 0}, b.logs()
        assert shm_segments(b.run_id) == []
        return b.json("summary.json"), batch_records(b.dir / "batches.jsonl")


@pytest.mark.parametrize("lengths", ["fixed", "buckets"])
def test_resumed_run_sees_the_same_batches(tmp_path: Path, lengths: str) -> None:
    """The batches of the killed and relaunched run are those an uninterrupted run
    trains: its plan's (tests/support/plan_walk.py uninterrupted)."""
    config = resumable_config(tmp_path, lengths)
    summary, got = resumed(config, tmp_path)
    assert sorted(got) == list(range(1, 17))
    assert summary["steps"] == 16
    assert summary["steps_this_run"] < 16, "the relaunch should have resumed, not restarted"
    # It resumed because the plan's fingerprint in its checkpoint was the stager's.
    assert set(summary["cursor"]["plan"]) == {"index", "seed", "buckets", "lengths"}
    assert trained([got], 16) == uninterrupted(config, 16)
    shapes = {tuple(r["shape"]) for r in got.values()}
    if lengths == "buckets":  # several shapes, each compiled once (per run)
        assert len(shapes) > 1 and {f for _, f, _ in shapes} <= {16, 24, 32}, shapes
        assert summary["trace_count"] == len(
            {tuple(r["shape"]) for r in got.values() if r["step"] > 16 - summary["steps_this_run"]}
        )
    else:
        assert shapes == {(4, 32, 32)} and summary["trace_count"] == 1


def test_sigterm_stops_every_process_cleanly_and_keeps_the_steps(tmp_path: Path) -> None:
    """SIGTERM between checkpoints: every process exits 0, nothing is left in /dev/shm,
    and the trainer saves the steps since its last checkpoint and writes its summary,
    so a relaunch resumes where the signal came."""
    train = {"steps": 100_000, "log_every": 1, "checkpoint_every": 1000, "jit_compile": False}
    config = write_config(tmp_path, SYNTHETIC | {"train": train})
    with Run(config, rid("term"), tmp_path) as run:
        run.start_all()
        log = tmp_path / f"{run.run_id}-trainer-3.log"
        run.poll_for(lambda: "step 3 loss" in log.read_text(), what="three trained steps")
        for verb in ("stager", "producers", "trainer"):
            run.signal(verb)
        assert run.wait_all(timeout_s=10) == {"stager": 0, "producers": 0, "trainer": 0}, run.logs()
        assert shm_segments(run.run_id) == []
        summary = run.json("summary.json")
    step = summary["steps"]
    assert step >= 3 and summary["ended"] == "stopped by SIGTERM", summary
    assert (run.dir / "checkpoints" / f"ckpt-{step}.index").exists(), "the steps were lost"
