"""The PyTorch and JAX example trainers (`ringfeed run CONFIG --trainer torch|jax`) in
real runs, as tests/process/test_trainer_e2e.py runs TensorFlow's: the loss falls on the
shipped clips; a trainer SIGKILLed after its first checkpoint and launched again sees
exactly the batches of an uninterrupted run; a trainer killed mid-step ends the run as
TensorFlow's does (the launcher exits with its code), leaving nothing in /dev/shm."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.configs import BUCKETS, SYNTHETIC, write_config
from tests.support.fault_sources import inject_faults
from tests.support.paths import REPO
from tests.support.plan_walk import trained, uninterrupted
from tests.support.polling import wait_for
from tests.support.processes import CLI
from tests.support.runs import Run, batch_records, rid, shm_segments

pytestmark = pytest.mark.slow

FRAMEWORKS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            importlib.util.find_spec(name) is None, reason=f"{name} is not installed"
        ),
    )
    for name in ("torch", "jax")
]
CHECKPOINT = {"torch": "ckpt-{}.pt", "jax": "ckpt-{}.npz"}


def trainer_run(config: Path, run_id: str, tmp_path: Path, framework: str) -> Run:
    run = Run(config, run_id, tmp_path)
    run.verb_args = {"trainer": ["--trainer", framework]}
    return run


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_example_trainer_learns_on_the_shipped_clips(tmp_path: Path, framework: str) -> None:
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
                "learning_rate": 3e-3,
                "cpu_threads": 1,
            },
            "producers": {"workers": 1},
        },
    )
    with trainer_run(config, rid(framework), tmp_path, framework) as run:
        run.start_all()
        codes = run.wait_all(timeout_s=180)
        assert codes == {"stager": 0, "producers": 0, "trainer": 0}, run.logs()
        summary = run.json("summary.json")
        assert summary["steps"] == 30 and summary["ended"] == "train.steps reached"
        assert summary["final_loss"] < 0.7 * summary["first_loss"], summary
        assert summary["trace_count"] == 1 and summary["delivered"] > 0
        assert (run.dir / "checkpoints" / CHECKPOINT[framework].format(30)).exists()
        assert shm_segments(run.run_id) == []


def resumable_config(tmp_path: Path, lengths: dict) -> Path:
    """16 steps of synthetic batches of `lengths` (BUCKETS, or SYNTHETIC's fixed shape),
    a checkpoint every 4, each batch logged."""
    train = {
        "steps": 16,
        "checkpoint_every": 4,
        "log_every": 4,
        "log_batches": True,
        "cpu_threads": 1,
    }
    raw = SYNTHETIC | lengths | {"producers": {"workers": 1}, "train": train}
    config = write_config(tmp_path, raw)
    inject_faults(config, delay_s=0.02)
    return config


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_killed_trainer_resumes_the_batches_of_an_uninterrupted_run(
    tmp_path: Path, framework: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch with length buckets; JAX with one shape: a process compiling three bucket
    shapes took tens of seconds here on 2 busy cores (the buckets' compile-once is
    tests/unit/test_jax_loader.py's), and the relaunched JAX trainer reads the first's
    compiled step from a persistent cache. The batches of an uninterrupted run are its
    plan's (tests/support/plan_walk.py uninterrupted)."""
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax-cache"))
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    lengths = BUCKETS if framework == "torch" else {"data": SYNTHETIC["data"]}
    config = resumable_config(tmp_path, lengths)
    first = CHECKPOINT[framework].format(4)
    with trainer_run(config, rid("B"), tmp_path, framework) as b:
        b.start_all()
        b.poll_for(lambda: (b.dir / "checkpoints" / first).exists(), what="a first checkpoint")
        b.signal("trainer", signal.SIGKILL)
        b.wait("trainer", 10)
        for verb in ("stager", "producers"):
            b.signal(verb)
        assert b.wait("stager", 10) == 0 and b.wait("producers", 10) == 0, b.logs()
        b.start_all()
        assert b.wait_all(180) == {"stager": 0, "producers": 0, "trainer": 0}, b.logs()
        summary, got = b.json("summary.json"), batch_records(b.dir / "batches.jsonl")
        assert shm_segments(b.run_id) == []
    assert sorted(got) == list(range(1, 17))
    assert summary["steps"] == 16 and summary["steps_this_run"] < 16, "resumed, not restarted"
    assert set(summary["cursor"]["plan"]) >= {"index", "seed", "buckets", "lengths"}
    steps = trained([got], 16)
    assert steps == uninterrupted(config, 16), "the resumed run saw other batches"
    shapes = {tuple(shape) for shape, _ in steps}
    assert len(shapes) > 1 if framework == "torch" else shapes == {(4, 32, 32)}, shapes


def child_running(parent: int, verb: bytes) -> int:
    """The pid of parent's child whose command line holds verb."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    for pid in children:
        if verb in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "):
            return int(pid)
    raise AssertionError(f"no child of {parent} runs {verb!r}")


def test_a_torch_trainer_killed_mid_step_ends_the_run_and_leaves_nothing(tmp_path: Path) -> None:
    """As for TensorFlow's trainer (docs/running.md#the-commands): the first process that
    fails stops the run, and the launcher exits with its code."""
    pytest.importorskip("torch")
    train = {"steps": 100_000, "log_every": 1, "checkpoint_every": 1000, "cpu_threads": 1}
    config = write_config(tmp_path, SYNTHETIC | {"train": train})
    run_id, log = rid("kill"), tmp_path / "launcher.log"
    with log.open("w") as out:
        argv = [*CLI, "run", str(config), "--run-id", run_id, "--trainer", "torch"]
        launcher = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "step 3 loss" in log.read_text(), 120, "three trained steps")
        os.kill(child_running(launcher.pid, b" trainer "), signal.SIGKILL)
        assert launcher.wait(60) == 137, log.read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert "trainer exited with code 137" in log.read_text()
    assert shm_segments(run_id) == []
