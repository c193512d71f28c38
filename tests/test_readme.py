"""The README's examples run as written: every bash block of "Bring your own data"
(one per corpus format) is run from a folder that holds what the repository root
holds for it (data/ and .venv/), and `validate` must find every clip usable."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.corpus_files import REPO

SECTION = "## Bring your own data"


def blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    assert SECTION in text
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def test_every_corpus_format_has_an_example() -> None:
    formats = {re.search(r"format: (\w+)", block)[1] for block in blocks()}
    assert formats == {"ljspeech", "csv", "jsonl", "libritts", "vctk"}


@pytest.mark.parametrize("block", blocks(), ids=lambda b: re.search(r"format: (\w+)", b)[1])
def test_a_format_example_runs_as_written(tmp_path: Path, block: str) -> None:
    (tmp_path / "data").symlink_to(REPO / "data")
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "usable        2 of 2 clips" in out.stdout, out.stdout
