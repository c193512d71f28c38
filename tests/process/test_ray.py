"""Producers as Ray actors on a real multi-node Ray cluster on this machine
(ray.cluster_utils.Cluster: each node its own raylet): an epoch exactly once with
every row checked, a node lost mid-epoch, a node added mid-run."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringfeed.consumer.stager.quarantine import read_quarantine
from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import SOURCE_HOOK_ENV, endpoints
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import ALL_REMOTE, small, tcp
from tests.support.fault_sources import inject_faults
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.runs import Run, finish, rid
from tests.support.stats import StatsReader

ray_cluster_utils = pytest.importorskip("ray.cluster_utils")
pytestmark = pytest.mark.slow

NODE = {"num_cpus": 2, "object_store_memory": 80 * 2**20}


@pytest.fixture
def cluster() -> Iterator:
    """A head without CPUs (no producers there) and one worker node; tests add more."""
    c = ray_cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": 80 * 2**20,
        },
    )
    try:
        yield c
    finally:
        c.shutdown()


def ray_config(tmp_path: Path, n: int, delay_s: float) -> tuple[Path, int]:
    port = free_port()
    cfg_path = small(
        tmp_path,
        items=n,
        delay_s=delay_s,
        transport=tcp(port),
        producers={"workers": 1, "per_node": 1},
        ring={"lease_s": 2.0, "heartbeat_s": 0.2, **ALL_REMOTE},
    )
    return cfg_path, port


def start_ray_producers(run: Run, cluster, port: int) -> None:
    cmd = ["--ray", cluster.address, "--connect", f"tcp://127.0.0.1:{port}"]
    run.procs["ray"] = run.start("producers", *cmd)


def nodes_of(rows: list[dict]) -> dict[str, str]:
    """actor id -> node id, from the producers' places ("ray actor A on node N")."""
    out = {}
    for row in rows:
        words = row.get("place", "").split()
        if len(words) == 6:
            out[words[2]] = words[5]
    return out


def test_producers_on_two_nodes_deliver_an_epoch_exactly_once(tmp_path: Path, cluster) -> None:
    cluster.add_node(**NODE)
    cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    n = 400
    cfg_path, port = ray_config(tmp_path, n, delay_s=0.002)
    cfg, run_id = load_config(cfg_path), rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        start_ray_producers(run, cluster, port)
        client = run.client(timeout_s=90)
        items = consume(client, timeout_s=120)  # every row checked against its item
        client.close()
        summary = finish(run, "ray")
    assert_exactly_once(items, cfg, n)
    places = nodes_of(summary["producers"])
    assert len(set(places.values())) == 2, summary["producers"]  # one producer per node
    assert all(p["remote"] and p["samples"] > 0 for p in summary["producers"])


def test_a_lost_node_and_a_new_node_keep_the_epoch_exactly_once(tmp_path: Path, cluster) -> None:
    first = cluster.add_node(**NODE)
    doomed = cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    n = 1500
    cfg_path, port = ray_config(tmp_path, n, delay_s=0.01)
    cfg, run_id = load_config(cfg_path), rid()
    seen: dict[str, object] = {}
    with (
        Run(cfg_path, run_id, tmp_path) as run,
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        run.start("stager")
        start_ray_producers(run, cluster, port)
        client = run.client(timeout_s=90)

        def chaos(delivered: int) -> None:
            if delivered >= 300 and "removed" not in seen:
                seen["before"] = nodes_of(stats.latest()["producers"])
                cluster.remove_node(doomed)  # its actor is restarted on the other node
                seen["removed"] = time.monotonic()
            if delivered >= 700 and "added" not in seen:
                seen["added"] = cluster.add_node(**NODE)

        items = consume(client, on_batch=chaos, timeout_s=240)
        seen["after"] = stats.latest()["producers"]
        client.close()
        finish(run, "ray")
    assert_exactly_once(items, cfg, n)
    before, after = seen["before"], nodes_of(seen["after"])
    assert len(set(before.values())) == 2, before
    doomed_id, first_id = doomed.node_id[:12], first.node_id[:12]
    new_id = seen["added"].node_id[:12]
    lost = [actor for actor, node in before.items() if node == doomed_id]
    # The lost node's actor came back on the remaining one, and the new node has its own.
    assert lost and after.get(lost[0]) == first_id, (before, after)
    on_new = [r for r in seen["after"] if r.get("place", "").endswith(new_id)]
    assert on_new and on_new[0]["samples"] > 0, seen["after"]


def test_without_ray_the_verb_says_what_to_install(tmp_path: Path) -> None:
    import subprocess

    cfg_path, port = ray_config(tmp_path, 10, 0.0)
    hide_ray = (
        "import sys; sys.modules['ray'] = None; from ringfeed.scripts.cli import main; "
        "sys.exit(main())"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            hide_ray,
            "producers",
            str(cfg_path),
            "--run-id",
            "x",
            "--ray",
            "auto",
            "--connect",
            f"tcp://127.0.0.1:{port}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "pip install 'ringfeed[ray]'" in out.stderr


@pytest.fixture
def raylets_without_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes started after this do not inherit a source hook an earlier test set."""
    monkeypatch.delenv(SOURCE_HOOK_ENV, raising=False)


def test_a_fault_injected_by_a_test_reaches_producers_on_ray(
    tmp_path: Path, raylets_without_hook: None, cluster
) -> None:
    """Ray starts actors from its raylets, not from the driver: the driver hands them
    the source hook, so an injected fault happens there too (quarantined once)."""
    cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    n, poison = 60, 5
    cfg_path, port = ray_config(tmp_path, n, delay_s=0.002)
    inject_faults(cfg_path, delay_s=0.002, raise_items=[poison])
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        start_ray_producers(run, cluster, port)
        client = run.client(timeout_s=90)
        items = consume(client, timeout_s=120)
        client.close()
        finish(run, "ray")
        quarantine = read_quarantine(run.dir / "quarantine.jsonl")
    assert sorted(items) == [i for i in range(n) if i != poison]
    assert [r["item_id"] for r in quarantine] == [f"synthetic-{poison:06d}"]
