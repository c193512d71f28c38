"""Real runs over a corpus in a published format (tests/support/published.py): two epochs,
stopped in the first and resumed by a fresh stager and producers at the consumer's plan
position; every row checked against its source row (text as tokens, speaker, language,
mel), each computed from the reference entry, never through the format under test."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np

from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.config import load_config, replace
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.id_tables import IDS_FILE
from tests.support.checks import same_rows
from tests.support.configs import write_config
from tests.support.paths import REPO
from tests.support.runs import rid, shm_segments, started

EPOCHS = 2


def demo_raw(tmp_path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """A run's raw config over the demo's audio (16 kHz) and alphabet (four languages)."""
    demo = load_config(REPO / "configs" / "multilingual.yaml")
    return {
        "data": data,
        "audio": {"sample_rate": 16000},
        "features": {
            "fmax": 8000.0,
            "max_frames": 320,
            "cache": False,
            "cache_dir": str(tmp_path / "cache"),
        },
        "text": {"max_text_len": 160, "alphabet": demo.text.alphabet},
        "ring": {"heartbeat_s": 0.1},
        "stager": {"batch_size": 4, "epochs": EPOCHS},
        "producers": {"workers": 2},
    }


def two_epochs(
    tmp_path: Path, data: dict[str, Any], reference: dict[str, Entry], stop_after: int = 2
) -> dict[str, Any]:
    """Two epochs of a real run on `data`, stopped after stop_after batches and resumed;
    every row checked against reference[its item id]. -> {"epochs": [Counter of the ids
    delivered in each epoch], "ids": the run's id tables, "index": the corpus index,
    "stats": the first part's stager.json}."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg_path = write_config(tmp_path, demo_raw(tmp_path, data))
    cfg = load_config(cfg_path)
    index = open_corpus(cfg)
    pipe = SamplePipeline(replace(cfg, features={"cache": False}))
    expected = {item_id: pipe(entry) for item_id, entry in reference.items()}
    epochs: list[collections.Counter] = [collections.Counter() for _ in range(EPOCHS)]
    run_id, start, batches, tables, stats = rid(), {}, 0, {}, {}
    for part in range(2):
        with started(cfg_path, tmp_path, run_id=run_id, timeout_s=90, **start) as (run, client):
            tables = json.loads((run.dir / IDS_FILE).read_text())
            while (part or batches < stop_after) and (batch := client.next(90)):
                for row in range(batch.meta.n_valid):
                    item_id = check_row(batch.arrays, row, index, reference, expected, tables)
                    epochs[int(batch.arrays["position"][row]) // index.n_items][item_id] += 1
                client.free(batch)
                batches += 1
            start = {"position": client.position, "batch_index": client.batch_index}
            client.close()
            if not part:
                run.stop()
            assert run.wait("stager", 30) in (0, -15), run.logs()
            stats = stats or run.json("stager.json")
        assert shm_segments(run_id) == []
    assert batches > stop_after, "the resumed run delivered nothing"
    return {"epochs": epochs, "ids": tables, "index": index, "stats": stats}


def check_row(
    a: dict[str, np.ndarray],
    row: int,
    index: Any,
    reference: dict[str, Entry],
    expected: dict[str, Any],
    tables: dict[str, list[str]],
) -> str:
    """One delivered row against its source: text, speaker, language, mel. -> its id."""
    item_id = index.item_id(int(a["items"][row]))
    entry, want = reference[item_id], expected[item_id]
    assert tables["speakers"][a["speaker"][row]] == entry.speaker, item_id
    assert tables["languages"][a["language"][row]] == entry.language, item_id
    t, f = int(a["text_lens"][row]), int(a["mel_lens"][row])
    assert np.array_equal(a["tokens"][row, :t], want.tokens), item_id
    assert f == len(want.mel) and same_rows(a["mel"][row, :f], want.mel), item_id
    return item_id
