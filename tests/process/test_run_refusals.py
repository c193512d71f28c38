"""What validate refuses, run refuses before it starts anything: one line, exit 2, no
traceback, no process, no run directory (issue 34: a balance weight naming no group)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO
from tests.support.processes import CLI

DEMO = REPO / "data" / "multilingual-demo" / "train.jsonl"


@pytest.mark.parametrize(
    ("stager", "why"),
    [
        ({"balance": {"by": "language", "weights": {"xx": 2.0}}},
         "stager.balance.weights.xx: no language of that name in this run"),
        ({"balance": {"by": "speaker", "weights": {"nobody": 0.5}}},
         "stager.balance.weights.nobody: no speaker of that name in this run"),
    ],
)  # fmt: skip
def test_a_balance_weight_naming_no_group_is_one_line_from_validate_and_run(
    tmp_path: Path, stager: dict, why: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"path": str(DEMO), "format": "jsonl"}, "stager": stager,
        "features": {"cache_dir": str(tmp_path / "cache")}, "run_root": str(tmp_path / "runs"),
    }))  # fmt: skip
    for verb in (["validate"], ["run", "--run-id", "refused"]):
        out = subprocess.run([*CLI, *verb, str(config)], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert out.returncode == 2, out.stdout + out.stderr
        errors = [line for line in out.stderr.splitlines() if "config error" in line]
        assert len(errors) == 1 and why in errors[0], out.stderr
        assert "Traceback" not in out.stdout + out.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, no run directory
    assert not list(Path("/dev/shm").glob("ringfeed-*refused*"))
