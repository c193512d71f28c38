"""validate on a corpus with audio that is not its text (tests/support/outlier_corpus.py),
as `ringfeed validate` runs: each language's speaking-rate band and the clips outside it,
and --deep decoding every clip in parallel (near-silent, clipped, truncated)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.configs import write_config
from tests.support.outlier_corpus import SMALL, make_outlier_corpus


def validate(cfg_path: Path, *flags: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "ringfeed.scripts.cli", "validate", str(cfg_path), *flags],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    return out.stdout


def test_validate_prints_the_band_and_the_clips_outside_it_and_deep_decodes(tmp_path) -> None:
    manifest = make_outlier_corpus(tmp_path / "c")
    cfg = {
        "data": {"path": str(manifest), "format": "jsonl", "outliers": "flag"},
        **SMALL,
        "features": {**SMALL["features"], "cache_dir": str(tmp_path / "cache")},
    }
    cfg_path = write_config(tmp_path, cfg)
    out = validate(cfg_path)
    band = next(line for line in out.splitlines() if "median" in line and " en " in line)
    assert "21 clips  median" in band and "3 outside" in band, out
    assert re.search(r"flag +3 outside their language's band", out), out
    for item_id in ("long-text", "cut-short", "cut-header"):  # the header says 40 % of it
        assert f"e.g. {item_id}:" in out, out
    assert "usable        20 of 21 clips" in out, out  # flag: out of band is still usable
    assert "deep check" not in out
    deep = validate(cfg_path, "--deep", "--workers", "2")
    lines = deep[deep.index("deep check") :].splitlines()
    assert "21 clips decoded" in lines[0] and "by 2 processes: 20 usable" in lines[0], deep
    found = "\n".join(lines[1:])
    assert "near-silent" in found and "(e.g. quiet)" in found, found
    assert "clipped" in found and "(e.g. clipped)" in found, found
    assert "truncated audio file" in found and "(e.g. cut-header)" in found, found
