"""What the trainer writes to TensorBoard (consumer/trainer/board.py), read back from the
event files of a real run on the multilingual demo corpus with one unreadable clip (the
shard cache's scalars: tests/process/test_tar_shards.py, a run on S3 shards)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
import yaml

from ringfeed.shared.config import load_config
from ringfeed.shared.corpus.open import open_corpus
from tests.support.board import read_scalars
from tests.support.configs import write_config
from tests.support.paths import REPO
from tests.support.runs import Run, batch_records, rid

pytestmark = pytest.mark.slow

DEMO = REPO / "data" / "multilingual-demo"
STEPS, LOG_EVERY = 12, 6


def corpus(tmp_path: Path) -> Path:
    """The demo's clips that name their language, and one whose file is missing."""
    lines = [json.loads(line) for line in (DEMO / "train.jsonl").read_text().splitlines()]
    kept = [line | {"audio": str(DEMO / line["audio"])} for line in lines if "language" in line]
    gone = kept[0] | {"audio": str(tmp_path / "gone.flac"), "text": "Not there at all."}
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in [*kept, gone]))
    return path


def test_tensorboard_has_the_rate_languages_speakers_and_skips_by_stage(tmp_path: Path) -> None:
    raw = yaml.safe_load((REPO / "configs" / "multilingual.yaml").read_text())
    raw["data"] = raw["data"] | {"path": str(corpus(tmp_path))}
    raw["features"] = raw["features"] | {"cache_dir": str(tmp_path / "cache")}
    raw["model"] = {"kwargs": {"d_model": 32, "n_layers": 1}}
    raw["train"] = raw["train"] | {
        "steps": STEPS,
        "log_every": LOG_EVERY,
        "checkpoint_every": STEPS,
        "log_batches": True,
        "jit_compile": False,
    }
    config = write_config(tmp_path, raw)
    cfg = load_config(config)
    entries = open_corpus(cfg).entries
    with Run(config, rid("board"), tmp_path) as run:
        run.start_all()
        codes = run.wait_all(timeout_s=180)
        assert codes == {"stager": 0, "producers": 0, "trainer": 0}, run.logs()
        board = read_scalars(run.dir / "tensorboard")
        batches = batch_records(run.dir / "batches.jsonl")
        quarantined = [json.loads(line) for line in (run.dir / "quarantine.jsonl").open()]
    assert board["train/learning_rate"][STEPS] == pytest.approx(cfg.train.learning_rate)
    # Samples per language and speaker: what the batches held, step by step.
    for step in (LOG_EVERY, STEPS):
        rows = [entries[i] for s in range(1, step + 1) for i in batches[s]["items"]]
        for key, of in (("language", lambda e: e.language), ("speaker", lambda e: e.speaker)):
            want = collections.Counter(of(e) for e in rows)
            got = {
                tag.split("/")[-1]: v[step]
                for tag, v in board.items()
                if tag.startswith(f"samples/{key}/") and step in v
            }
            assert got == want, (step, key)
    # The missing clip, skipped and quarantined at its stage, as the quarantine file says.
    stages = collections.Counter(r["stage"] for r in quarantined)
    assert sum(stages.values()) == 1, quarantined
    for stage, n in stages.items():
        assert board[f"stager/quarantined/{stage}"][STEPS] == n
        assert board[f"stager/skipped/{stage}"][STEPS] >= 1
    assert board["stager/delivered"][STEPS] >= STEPS * cfg.stager.batch_size - 8
