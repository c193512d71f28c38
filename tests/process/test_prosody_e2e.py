"""features.pitch_norm through real processes: a run without the prosody table is refused
in one line that says what to run; with it, every delivered row's pitch is its clip's
voiced log-f0 normalized by its speaker's moments, and the run keeps the table that
every checkpoint then carries (tests/unit/test_prosody_stats.py)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.prepare.prosody_pass import compute_table
from ringfeed.shared.config import load_config, replace
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.prosody_table import RUN_FILE
from tests.support.checks import same_rows
from tests.support.configs import write_config
from tests.support.paths import REPO
from tests.support.published import DEMO
from tests.support.runs import Run, rid, started

pytestmark = pytest.mark.slow


def test_rows_carry_pitch_normalized_by_their_speaker(tmp_path: Path) -> None:
    demo = load_config(REPO / "configs" / "multilingual.yaml")
    cfg_path = write_config(
        tmp_path,
        {
            "data": {
                "path": str(DEMO / "train.jsonl"),
                "format": "jsonl",
                "language": "auto",
                "detect_languages": ["de", "en", "fa", "ru"],
            },
            "audio": {"sample_rate": 16000},
            "features": {
                "fmax": 8000.0,
                "max_frames": 320,
                "cache_dir": str(tmp_path / "cache"),
                "pitch": True,
                "pitch_norm": "speaker",
            },
            "text": {"max_text_len": 160, "alphabet": demo.text.alphabet},
            "ring": {"heartbeat_s": 0.1},
            "stager": {"batch_size": 8, "epochs": 1},
            "producers": {"workers": 2},
        },
    )
    cfg = load_config(cfg_path)
    with Run(cfg_path, rid(), tmp_path) as refused:
        refused.prepares = False  # the stager alone, as a user may start it: it prepares nothing
        refused.start("stager")
        assert refused.wait("stager", 60) == 2
        assert "is not prepared" in refused.logs() and "run `ringfeed prepare CONFIG`" in (
            refused.logs()
        )
    _, table = compute_table(cfg, open_corpus(cfg), workers=1)
    index = open_corpus(cfg)
    pipe = SamplePipeline(replace(cfg, features={"cache": False}), index=index)
    expected = [pipe(e, k) for k, e in enumerate(index.entries)]
    items: list[int] = []
    with started(cfg_path, tmp_path, timeout_s=60) as (run, client):
        assert json.loads((run.dir / RUN_FILE).read_text()) == table
        while (batch := client.next(90)) is not None:
            a = batch.arrays
            for row in range(batch.meta.n_valid):
                item = int(a["items"][row])
                f, want = int(a["mel_lens"][row]), expected[item].fields["pitch"]
                voiced = expected[item].fields["voiced"] == 1
                assert same_rows(a["pitch"][row, :f], want), item
                assert (a["pitch"][row, :f][~voiced] == 0).all(), item
                items.append(item)
            client.free(batch)
        client.close()
        assert run.wait("stager", 30) == 0, run.logs()
    assert collections.Counter(items) == collections.Counter(range(index.n_items))
    by_speaker: dict[str, list[np.ndarray]] = {}
    for k, e in enumerate(index.entries):
        voiced = expected[k].fields["voiced"] == 1
        by_speaker.setdefault(e.speaker, []).append(expected[k].fields["pitch"][voiced])
    for speaker, parts in by_speaker.items():
        values = np.concatenate(parts).astype(np.float64)
        assert abs(values.mean()) < 1e-3 and abs(values.std() - 1) < 1e-3, speaker
