"""What validate refuses, run refuses before it starts anything: one line, exit 2, no
traceback, no process, no run directory (issue 34: a balance weight naming no group).
A prosody table features.pitch_norm needs that is missing or was made by another pitch
estimator was refused too (issue 34); now both prepare it first (issue 43)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from ringfeed.producer.features.prosody import PROSODY_VERSION
from ringfeed.shared.config import load_config
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.prosody_table import read_table, table_path, write_table
from tests.support.paths import REPO
from tests.support.processes import CLI

DEMO = REPO / "data" / "multilingual-demo" / "train.jsonl"


PITCH_NORM = {"pitch": True, "pitch_norm": "speaker"}


@pytest.mark.parametrize(
    ("section", "why"),
    [
        (
            {"stager": {"balance": {"by": "language", "weights": {"xx": 2.0}}}},
            "stager.balance.weights.xx: no language of that name in this run",
        ),
        (
            {"stager": {"balance": {"by": "speaker", "weights": {"nobody": 0.5}}}},
            "stager.balance.weights.nobody: no speaker of that name in this run",
        ),
    ],
)
def test_what_validate_refuses_is_one_line_from_validate_and_run(
    tmp_path: Path, section: dict, why: str
) -> None:
    config = tmp_path / "c.yaml"
    features = {"cache_dir": str(tmp_path / "cache"), **section.get("features", {})}
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(DEMO), "format": "jsonl"},
                "stager": section.get("stager", {}),
                "features": features,
                "run_root": str(tmp_path / "runs"),
            }
        )
    )
    for verb in (["validate"], ["run", "--run-id", "refused"]):
        out = subprocess.run(
            [*CLI, *verb, str(config)], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 2, out.stdout + out.stderr
        errors = [line for line in out.stderr.splitlines() if "config error" in line]
        assert len(errors) == 1 and why in errors[0], out.stderr
        assert "Traceback" not in out.stdout + out.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, no run directory
    assert not list(Path("/dev/shm").glob("ringfeed-*refused*"))


def test_validate_prepares_a_prosody_table_made_by_another_estimator(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(DEMO), "format": "jsonl"},
                "features": {"cache_dir": str(tmp_path / "cache"), **PITCH_NORM},
                "run_root": str(tmp_path / "runs"),
            }
        )
    )
    cfg = load_config(config)
    path = table_path(cfg, open_corpus(cfg, in_subprocess=False).digest)
    write_table(path, {"speakers": {}, "global": {}, "prosody_version": "0-old"})
    out = subprocess.run(
        [*CLI, "validate", str(config)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"prosody     {path}: 3 speakers" in out.stdout
    assert read_table(path)["prosody_version"] == PROSODY_VERSION
