"""The README's fields-of-your-own example runs as written ("Sample fields"): its bash
block writes my_fields.py and fields.yaml and validates them, and the function it
wrote then gives clips their fields through the producer's pipeline."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.config import load_config, replace
from ringfeed.shared.corpus.open import read_corpus
from tests.broken_dataset import GOOD_SOURCES
from tests.corpus_files import REPO

SECTION = "## Sample fields"


def test_the_user_field_example_runs_as_written(tmp_path: Path) -> None:
    section = (REPO / "README.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    (tmp_path / "data").symlink_to(REPO / "data")
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"style +float32 +\[4, 16\] +own length", out.stdout), out.stdout
    sys.path.insert(0, str(tmp_path))  # where a producer finds my_fields
    try:
        cfg = load_config(tmp_path / "fields.yaml")
        pipe = SamplePipeline(replace(cfg, features={"cache_dir": str(tmp_path / "cache")}))
        for entry in [e for e in read_corpus(cfg)[0] if e.item_id in GOOD_SOURCES]:
            s = pipe(entry)
            assert s.fields["loudness"].shape == (len(s.mel),)
            assert s.fields["emotion"].tolist() in ([0], [1])
            assert s.fields["style"].shape == (1 + len(entry.text) % 4, 16)
            assert np.isfinite(s.fields["style"]).all()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_fields", None)
