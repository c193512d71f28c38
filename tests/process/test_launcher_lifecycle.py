"""The launcher over a run's life (issue 34): Ctrl-C ends it with exit 0 and one line
that names the checkpoint and the command that resumes it; the producers say the run was
stopped; that command resumes exactly (every step's batch the plan's next one); after the
corpus changed it is refused with what to do, and with --new-plan resumes on a new plan."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.plan.shuffle import Shuffle
from tests.support.configs import SYNTHETIC, write_config
from tests.support.paths import REPO
from tests.support.polling import wait_for
from tests.support.runs import batch_records, rid, shm_segments

# Steps the printed command runs past the checkpoint Ctrl-C left.
RESUMED_STEPS = 3

pytestmark = pytest.mark.slow


def launch(argv: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_ctrl_c_says_how_to_resume_and_a_changed_corpus_resumes_with_new_plan(
    tmp_path: Path,
) -> None:
    train = {
        "steps": 100_000,
        "log_every": 1,
        "checkpoint_every": 1000,
        "jit_compile": False,
        "log_batches": True,
    }
    config = write_config(tmp_path, SYNTHETIC | {"train": train})
    run_id = rid("life")
    first = launch(
        [str(REPO / "scripts/launch.sh"), "run", str(config), "--run-id", run_id], tmp_path
    )
    summary_dir = tmp_path / "runs" / run_id
    # A line per step (train.log_batches): stopped once it trains, not while TensorFlow
    # still builds its first step (which on a loaded host outlasted the launcher's grace).
    batches = summary_dir / "batches.jsonl"
    wait_for(
        lambda: batches.exists() and batches.stat().st_size > 0, 120, "the trainer's first steps"
    )
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, out + err
    line = next(line for line in err.splitlines() if "resume it with:" in line)
    assert re.search(rf"stopped run {run_id}; its last checkpoint is \S+/ckpt-\d+;", line), line
    # The command works from anywhere: it goes where runs/ is, and names `ringfeed` whole
    # (this environment's console script: an installed wheel has no launch.sh).
    printed = line.split("resume it with: ", 1)[1]
    where, command = printed.split(" && ", 1)
    assert shlex.split(where) == ["cd", str(tmp_path)], printed
    command = shlex.split(command)
    assert Path(command[0]).is_absolute() and Path(command[0]).name == "ringfeed", printed
    assert command[1:3] == ["run", str(config)], printed
    assert command[-2:] == ["--run-id", run_id], printed
    # The producers say why they stop: the run was stopped, not finished (they heard it from
    # the stager, or from the launcher's signal, whichever came first).
    assert "the run was stopped by SIGTERM" in err and "(run finished)" not in err
    assert shm_segments(run_id) == []
    raw, stopped_at = resumes_exactly(config, printed, summary_dir)
    # The corpus changes (one more item): the resume is refused, saying what to do...
    raw["data"]["synthetic_items"] += 1
    raw["train"]["steps"] = stopped_at + RESUMED_STEPS + 6
    config.write_text(yaml.safe_dump(raw))
    again = from_elsewhere(printed)
    assert again.returncode == 2, again.stdout + again.stderr
    assert "--new-plan" in again.stdout + again.stderr
    # ... and --new-plan from the launcher resumes it on a new plan.
    new = from_elsewhere(printed + " --new-plan")
    assert new.returncode == 0, new.stdout + new.stderr
    summary = yaml.safe_load((summary_dir / "summary.json").read_text())
    assert summary["steps"] == raw["train"]["steps"] and summary["steps_this_run"] == 6
    assert shm_segments(run_id) == []


def from_elsewhere(command: str) -> subprocess.CompletedProcess:
    """The printed command as a user pastes it, in a shell whose directory is not the run's."""
    return subprocess.run(
        ["bash", "-c", command], cwd="/", capture_output=True, text=True, timeout=180
    )


def resumes_exactly(config: Path, printed: str, summary_dir: Path) -> tuple[dict, int]:
    """Run the printed command RESUMED_STEPS steps past the stop: each step's batch, before
    the stop and after it, is the plan's next one. Returns the config and the stop's step."""
    raw = yaml.safe_load(config.read_text())
    stopped_at = yaml.safe_load((summary_dir / "summary.json").read_text())["steps"]
    raw["train"]["steps"] = stopped_at + RESUMED_STEPS
    config.write_text(yaml.safe_dump(raw))
    resumed = from_elsewhere(printed)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    steps = batch_records(summary_dir / "batches.jsonl")
    assert sorted(steps) == list(range(1, stopped_at + RESUMED_STEPS + 1))
    rows, n_items = raw["stager"]["batch_size"], raw["data"]["synthetic_items"]
    plan = Plan(Shuffle(n_items, raw["stager"].get("seed", 1234)))  # epochs 0: unbounded
    for step, record in steps.items():
        first = (step - 1) * rows
        assert record["items"] == [plan.item_at(p) for p in range(first, first + rows)], step
    return raw, stopped_at
