"""A client finds its run wherever it starts (issue 34): run_root is relative to the
working directory, so a client started in another folder with the same config reads its
run's secret where the live stager recorded it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.shared.config import load_config
from ringfeed.shared.run.run_secret import run_record
from tests.support.checks import assert_exactly_once, consume
from tests.support.configs import SYNTHETIC
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
