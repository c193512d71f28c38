"""scripts/slurm.sh's shell logic under a fake Slurm: `srun` and `scontrol` on PATH that
run each task here. The run is real: stager, producers and a drain consumer on the
"head", one remote producer pool per other "node" over tcp with the job's CURVE keys."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.support.configs import small
from tests.support.paths import REPO
from tests.support.ports import free_port

pytestmark = pytest.mark.slow

FAKE_SRUN = r"""#!/usr/bin/env bash
# Fake srun: log the call, run the command once per requested node, here.
echo "srun $*" >> "$FAKE_SLURM_LOG"
[ -n "${FAKE_SRUN_NOOP:-}" ] && exit 0  # a step that ends at once (its nodes died)
nodes=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes=*) nodes=${1#--nodes=}; shift ;;
    --*) shift ;;
    *) break ;;
  esac
done
for i in $(seq 0 $((nodes - 1))); do SLURM_NODEID=$((i + 1)) "$@" & done
wait
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
# Fake scontrol: `scontrol show hostnames a,b,c` prints one name a line.
[ "$1 $2" = "show hostnames" ] && tr ',' '\\n' <<< "$3"
"""


def slurm_job(
    tmp_path: Path, port: int, args: tuple[str, ...] = ("--consumer", "drain"), **env: str
) -> subprocess.CompletedProcess:
    """Run slurm.sh as a job of 3 nodes under the fake srun and scontrol."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    cfg_path = small(
        tmp_path, items=400, delay_s=0.004, producers={"workers": 1}, transport={"port": port}
    )
    env = (
        os.environ
        | env
        | {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "localhost,node-b,node-c",
            "SLURM_SUBMIT_DIR": str(tmp_path),
            "FAKE_SLURM_LOG": str(tmp_path / "slurm.log"),
        }
    )
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm.sh"), str(cfg_path), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_slurm_script_runs_head_and_remote_producers(tmp_path: Path) -> None:
    port = free_port()
    done = slurm_job(tmp_path, port)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    calls = (tmp_path / "slurm.log").read_text().splitlines()
    assert len(calls) == 1, calls
    args = shlex.split(calls[0])
    assert "--nodes=2" in args and "--exclude=localhost" in args
    assert args[args.index("--connect") + 1] == f"tcp://localhost:{port}"
    job_dir = tmp_path / ".ringfeed-slurm-4242"
    assert (job_dir / "keys" / "server.key_secret").stat().st_mode & 0o777 == 0o600
    stager = json.loads((tmp_path / "runs" / "slurm-4242" / "stager.json").read_text())
    assert stager["counters"]["delivered"] == 400
    remote = [p for p in stager["producers"] if p["remote"]]
    local = [p for p in stager["producers"] if not p["remote"]]
    assert len(remote) == 2 and local, stager["producers"]  # one pool per other node


def test_producer_nodes_that_end_first_do_not_fail_the_job(tmp_path: Path) -> None:
    # Their step is gone before the run ends: the run still ends 0, and so does the job
    # (stopping producers that already ended once made the script exit 1).
    done = slurm_job(tmp_path, free_port(), FAKE_SRUN_NOOP="1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stager = json.loads((tmp_path / "runs" / "slurm-4242" / "stager.json").read_text())
    assert stager["counters"]["delivered"] == 400  # the head's own producers did it all


def test_every_node_a_training_worker_one_task_each(tmp_path: Path) -> None:
    done = slurm_job(
        tmp_path, free_port(), ("--workers", "--trainer-port", "7000"), FAKE_SRUN_NOOP="1"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (call,) = (tmp_path / "slurm.log").read_text().splitlines()
    args = shlex.split(call)
    assert "--nodes=3" in args and "--ntasks-per-node=1" in args
    assert "--kill-on-bad-exit=1" in args and "--exclude=localhost" not in args
    task = args[args.index("--worker-task") + 1 :]
    assert task == ["3", "slurm-4242", "localhost:7000,node-b:7001,node-c:7002"]


def test_slurm_script_outside_a_job_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm.sh"), "configs/demo.yaml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0 and "inside a Slurm job" in done.stderr
