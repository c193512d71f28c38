"""A client of no live run says where it looked and why nothing answered (issue 34; a
client started in another folder finding its live run: tests/process/test_client_finds_run.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ringfeed.consumer.client.batch_client import BatchClient, StagerGone
from ringfeed.shared.config import load_config
from ringfeed.shared.run.run_secret import run_record
from tests.support.configs import SYNTHETIC
from tests.support.runs import rid


def test_a_client_of_no_live_run_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg, run_id = load_config(_config(tmp_path)), rid("none")
    client = BatchClient(cfg, run_id)
    with pytest.raises(StagerGone) as gone:
        client.connect(timeout_s=0.5)
    client.close(finished=False)
    why = str(gone.value)
    assert "no stager answered on ipc://" in why and f"{tmp_path}/runs/{run_id}" in why
    assert str(run_record(run_id)) in why and "start it first" in why


def _config(folder: Path) -> Path:
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump(SYNTHETIC | {"run_root": "runs"}))
    return path
