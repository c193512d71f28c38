"""Producers that cannot map the ring: payloads over TCP, CURVE keys, refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ringfeed.shared.config import load_config
from ringfeed.shared.config.environment import endpoints
from ringfeed.shared.wire.keys import generate
from tests.support.checks import consume
from tests.support.configs import ALL_REMOTE, small, tcp
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.runs import Run, rid, shm_segments
from tests.support.stats import StatsReader

pytestmark = pytest.mark.slow


def test_remote_and_local_producers_share_one_epoch_exactly_once(tmp_path: Path) -> None:
    port = free_port()
    cfg_path = small(
        tmp_path,
        items=300,
        delay_s=0.004,
        transport=tcp(port),
        producers={"workers": 1},
    )
    run_id = rid()
    with Run(cfg_path, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        remote = run.start(
            "producers", "--remote", "--connect", f"tcp://127.0.0.1:{port}", "--name", "far"
        )
        run.procs["remote"] = remote
        client = run.client(timeout_s=30)
        items = consume(client)
        client.close()
        assert run.wait("stager", 20) == 0
        assert shm_segments(run_id) == []
    assert sorted(items) == list(range(300))
    producers = {p["name"]: p for p in run.json("stager.json")["producers"]}
    # Both kinds did real work: the remote one only through payload frames.
    assert producers["far-0"]["remote"] and producers["far-0"]["samples"] > 0
    local = [p for name, p in producers.items() if not p["remote"]]
    assert local and local[0]["samples"] > 0


def keyed_config(folder: Path, port: int, keys: Path) -> Path:
    """A small config in folder whose tcp transport uses the keys in `keys`."""
    folder.mkdir(exist_ok=True)
    return small(
        folder,
        items=150,
        delay_s=0.004,
        transport=tcp(port, keys),
        producers={"workers": 1},
        ring=ALL_REMOTE,
    )


def test_a_producer_without_an_accepted_key_is_refused_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    head, port = tmp_path / "keys", free_port()
    good = generate(head, "good")
    stranger = generate(tmp_path / "other-head", "stranger")  # a key pair the head never saw
    wrong_server = generate(tmp_path / "third-head", "lost")  # trusts another head's key
    shutil.copy(head / "server.key", stranger / "server.key")
    cfg_path = keyed_config(tmp_path, port, head)
    good_cfg = keyed_config(tmp_path / "g", port, good)
    wrong_cfg = keyed_config(tmp_path / "w", port, wrong_server)
    bad_cfg = keyed_config(tmp_path / "b", port, stranger)
    cfg = load_config(cfg_path)
    run_id = rid()
    with (
        Run(cfg_path, run_id, tmp_path) as run,
        StatsReader(endpoints(cfg, run_id).stats) as stats,
    ):
        run.start("stager")
        run.config = bad_cfg
        run.procs["bad"] = run.start(
            "producers", "--remote", "--connect", f"tcp://127.0.0.1:{port}", "--name", "bad"
        )
        run.config = wrong_cfg
        run.procs["wrong"] = run.start(
            "producers", "--remote", "--connect", f"tcp://127.0.0.1:{port}", "--name", "wrong"
        )
        run.config = good_cfg
        run.procs["good"] = run.start(
            "producers", "--remote", "--connect", f"tcp://127.0.0.1:{port}", "--name", "good"
        )
        run.config = cfg_path
        client = run.client(timeout_s=30)
        wait_for(
            lambda: stats.latest()["refused_producers"] >= 2,
            20,
            "two refusals: one by ZAP, one at the handshake",
            context=run.logs,
        )
        items = consume(client)
        client.close()
        assert run.wait("stager", 20) == 0
    assert sorted(items) == list(range(150))
    names = {p["name"] for p in run.json("stager.json")["producers"]}
    assert "bad-0" not in names and "wrong-0" not in names
    logs = run.logs(tail=100_000)
    assert "/authorized" in logs and "CURVE handshake failed" in logs  # both refusals named
