"""Trust boundaries that need real processes: a producer pool in another PID and UTS
namespace (its pids and host name mean nothing here, so it cannot be fenced) never
delivers stale rows; another user's segment in /dev/shm stops neither a run nor
`ringfeed cleanup`. Every row is checked against the item it claims to be. The other
trust boundaries play against the stager in the test process
(tests/unit/test_trust.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ringfeed.scripts.runner import worker_pids
from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import endpoints
from ringfeed.shared.memory.ring import SEGMENT_PREFIX, SHM_DIR
from ringfeed.shared.run.process import die_with_parent
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import small
from tests.support.paths import REPO
from tests.support.processes import CLI
from tests.support.runs import Run, finish, rid, started
from tests.support.stats import StatsReader

pytestmark = pytest.mark.slow


def can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--uts", "--fork", "true"], capture_output=True)
    return probe.returncode == 0


def pod_holds_nothing(stats: dict) -> bool:
    """No producer of the pod (host pod-7) holds a grant: any it held were taken back."""
    return all(pr["grants"] == 0 for pr in stats["producers"] if pr["host"] == "pod-7")


def stop_the_pods_worker(pod_pid: int, stats: StatsReader, lease_s: float) -> int:
    """SIGSTOP the worker of the pool inside the pod (pod_pid: its unshare) past its
    lease, until the stager took back its grants; SIGCONT it; returns its pid."""
    children = Path(f"/proc/{pod_pid}/task/{pod_pid}/children").read_text()
    workers = [w for pool_pid in map(int, children.split()) for w in worker_pids(pool_pid)]
    assert workers, "the pod's worker is not running"
    os.kill(workers[0], signal.SIGSTOP)
    try:
        time.sleep(2.5 * lease_s)  # the fault: stopped past its lease, grants queued
        stats.first(pod_holds_nothing, 10, "the stopped pod's grants taken back")
    finally:
        os.kill(workers[0], signal.SIGCONT)
    return workers[0]


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare (PID and UTS namespaces)")
def test_a_producer_in_another_pid_and_uts_namespace_never_delivers_stale_rows(
    tmp_path: Path,
) -> None:
    """A pool in its own PID and UTS namespaces (a pod sharing /dev/shm): its pids and
    host name mean nothing here, so it cannot be fenced. Its worker is stopped past its
    lease three times while its slots are granted again; every row must still be right."""
    n, lease_s = 600, 0.5
    cfg_path = small(
        tmp_path,
        items=n,
        delay_s=0.004,
        features={"max_frames": 1024},  # slots of 320 KiB: writes take a while
        ring={"lease_s": lease_s, "heartbeat_s": 0.1},
        producers={"workers": 1},
    )
    cfg, run_id = load_config(cfg_path), rid()
    cli = [*CLI, "producers", str(cfg_path), "--run-id", run_id]
    pod_cmd = [
        "unshare",
        "--pid",
        "--uts",
        "--fork",
        "--kill-child",
        "sh",
        "-c",
        'hostname pod-7 && exec "$@"',
        "sh",
        *cli,
    ]
    with (
        Run(cfg_path, run_id, tmp_path) as run,
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        run.start("stager")
        run.start("producers")
        pod = subprocess.Popen(pod_cmd, cwd=REPO, preexec_fn=die_with_parent)
        run.procs["pod"] = pod
        client = run.client(timeout_s=30)
        stopped = []

        def stop_the_pod(n_items: int) -> None:
            if n_items >= 100 * (len(stopped) + 1) and len(stopped) < 3:
                stopped.append(stop_the_pods_worker(pod.pid, stats, lease_s))

        items = consume(client, on_batch=stop_the_pod)
        client.close()
        summary = finish(run, "producers", "pod")
    assert len(stopped) == 3
    assert_exactly_once(items, cfg, n)  # consume() checked every row's stamp
    pod_rows = [pr for pr in summary["producers"] if pr["host"] == "pod-7"]
    assert pod_rows and not pod_rows[0]["remote"]  # it maps the ring, like a local one
    # The stale-writer situation did arise: woken, the worker found grants it still held
    # granted again (their generation moved on) and dropped them; any write that slips
    # past that check is caught by the stager's check after copying ("torn").
    assert pod_rows[0]["work"]["taken_back"] + summary["counters"]["torn"] >= 1, summary


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file of another user")
def test_another_users_segment_in_dev_shm_does_not_stop_a_run(tmp_path: Path) -> None:
    # Another user's file under our own prefix (the worst case: a squatter) and one
    # under theirs: neither may stop the stager or `ringfeed cleanup`.
    squat = [SHM_DIR / f"{SEGMENT_PREFIX}squat-samples", SHM_DIR / "ringfeed-65534-x-samples"]
    for path in squat:
        path.write_bytes(b"\0" * 64)
        os.chown(path, 65534, 65534)
        os.utime(path, (time.time() - 3600, time.time() - 3600))  # old: looks stale
    try:
        n = 120
        cfg_path = small(tmp_path, items=n)
        cfg, run_id = load_config(cfg_path), rid()
        with started(cfg_path, tmp_path, run_id=run_id) as (run, client):
            items = consume(client)
            client.close()
            finish(run, "producers")
        assert_exactly_once(items, cfg, n)
        cleanup = subprocess.run([*CLI, "cleanup"], cwd=REPO, capture_output=True)
        assert cleanup.returncode == 0, cleanup.stderr
    finally:
        for path in squat:
            path.unlink(missing_ok=True)
