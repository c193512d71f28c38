"""The command-line entries a user types first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.runs import REPO


def ringfeed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scripts.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_validate_prints_the_derived_sizes() -> None:
    out = ringfeed("validate", "configs/demo.yaml")
    assert out.returncode == 0, out.stderr
    assert "sample slot" in out.stdout and "rings total" in out.stdout
    assert "[800, 80]" in out.stdout  # the mel field's shape


def test_validate_names_the_key_to_change(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"ring": {"slots": 0}}))
    out = ringfeed("validate", str(bad))
    assert out.returncode == 2 and "ring.slots" in out.stderr
    huge = tmp_path / "huge.yaml"
    huge.write_text(yaml.safe_dump({"ring": {"slots": 1_000_000}}))
    out = ringfeed("validate", str(huge))
    assert out.returncode == 2 and "/dev/shm" in out.stderr and "ring.slots" in out.stderr


def test_launch_help_lists_the_verbs() -> None:
    out = subprocess.run(
        ["bash", "scripts/launch.sh", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and "producers CONFIG --connect" in out.stdout
