"""A client finds its run wherever it starts (issue 34): run_root is relative to the
working directory, so a client started in another folder with the same config reads its
run's secret where the live stager recorded it; a client started by hand for a run
nobody starts says so within seconds (issue 43)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from ringfeed.consumer.client.batch_client import BatchClient, StagerGone
from ringfeed.shared.config import load_config
from ringfeed.shared.run.run_secret import run_record
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import SYNTHETIC
from tests.support.processes import CLI
from tests.support.runs import Run, rid


@pytest.mark.slow
def test_a_client_in_another_directory_finds_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    config = tmp_path / "config.yaml"
    raw = SYNTHETIC | {"stager": {"batch_size": 4, "epochs": 1}, "run_root": "runs"}
    config.write_text(yaml.safe_dump(raw))
    cfg, run_id = load_config(config), rid("where")
    monkeypatch.chdir(here)  # the run's processes start here: runs/ is here/runs
    with Run(config, run_id, tmp_path) as run:
        run.start("stager")
        run.start("producers")
        monkeypatch.chdir(elsewhere)  # the client starts in another folder
        client = BatchClient(cfg, run_id)
        client.connect(timeout_s=60)
        assert client.run_dir == here / "runs" / run_id
        assert_exactly_once(consume(client), cfg, cfg.data.synthetic_items)
        client.close()
    assert not run_record(run_id).exists()  # the stager took its record with it


def test_a_consumer_started_by_hand_for_a_run_nobody_starts_says_so_within_seconds(
    tmp_path: Path,
) -> None:
    """`ringfeed drain CONFIG --run-id <a typo>`: no stager recorded that run and no
    process starts one, so it says so after KNOWN_RUN_S, not after its 60 s."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(SYNTHETIC | {"run_root": "runs"}))
    run_id = rid("typo")
    started = time.monotonic()
    command = [*CLI, "drain", str(config), "--run-id", run_id]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert time.monotonic() - started < 20, out.stderr
    assert f"drain: no run '{run_id}' is known on this host" in out.stderr, out.stderr
    assert f"--run-id {run_id} --consumer none" in out.stderr


def test_a_consumer_of_a_stager_that_failed_at_start_is_told_within_seconds(
    tmp_path: Path,
) -> None:
    """The stager exits 2 at start (no corpus there): the launcher's consumer in this
    process stops waiting once no process starts the run any more, and its socket is
    closed (left open, its context's collection waited for it for ever)."""
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {"data": {"path": str(tmp_path / "none")}, "run_root": str(tmp_path / "runs")}
        )
    )
    with Run(config, rid("failed"), tmp_path) as run:
        run.prepares = False  # the stager itself meets the missing corpus
        run.start("stager")
        started = time.monotonic()
        with pytest.raises(StagerGone, match="is known on this host"):
            run.client(timeout_s=60)
        assert time.monotonic() - started < 30
        assert run.wait("stager", 10) == 2
