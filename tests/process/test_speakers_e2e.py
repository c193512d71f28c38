"""Speaker and language ids through real processes: every delivered row's ids are those of
its manifest entry, with length buckets on and a stager restarted in the middle; a
resume whose corpus has a speaker the run does not know is refused, naming it."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.prepare.prepare import corpus_vocabulary
from ringfeed.shared.config import load_config, replace
from ringfeed.shared.corpus.open import open_corpus
from ringfeed.shared.run.id_tables import IDS_FILE, padding_ids
from tests.support.checks import same_rows
from tests.support.configs import EIGHT_KHZ_FEATURES, write_config
from tests.support.paths import WAVS
from tests.support.runs import Run, rid, shm_segments, started

pytestmark = pytest.mark.slow
SPEAKERS = ["zoe", "ann", "bob"]
LANGUAGES = ["fa", "de", "en", "ru"]


def manifest(path: Path, extra_speaker: str = "") -> Path:
    """16 whole clips and 16 one-second segments of them, speakers and languages mixed."""
    lines = []
    for k in range(32):
        wav = WAVS / f"LJ001-{k % 16 + 1:04d}.wav"
        speaker = extra_speaker or SPEAKERS[k % 3]
        line = {
            "audio": str(wav),
            "text": f"Clip {k} of the test.",
            "speaker": speaker,
            "language": LANGUAGES[k % 4],
        }
        if k >= 16:
            line |= {"offset": 0.5, "duration": 1.0, "id": f"seg-{k}"}
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")
    return path


def config(tmp_path: Path, data: Path, tokens: str) -> Path:
    """The run's config, its alphabet built from the corpus (the numbers in each text are
    spelled out in its language: Persian and Russian letters among them, or phonemes)."""
    path = _config(tmp_path, data, {"tokens": tokens})
    alphabet = corpus_vocabulary(load_config(path)).alphabet
    return _config(tmp_path, data, {"tokens": tokens, "alphabet": alphabet})


def _config(tmp_path: Path, data: Path, text: dict) -> Path:
    return write_config(
        tmp_path,
        {
            "data": {"path": str(data), "format": "jsonl"},
            "audio": {"sample_rate": 8000},
            "features": {
                **EIGHT_KHZ_FEATURES,
                "max_frames": 320,
                "cache_dir": str(tmp_path / "cache"),
            },
            "text": text,
            "ring": {"heartbeat_s": 0.1},
            "stager": {"batch_size": 4, "epochs": 1, "buckets": [64, 160, 320]},
            "producers": {"workers": 2},
        },
    )


def check_rows(batch, entries, expected, tables, cfg) -> list[int]:
    """Each valid row against the entry its item is: ids, tokens, mel. -> the items."""
    a, n = batch.arrays, batch.meta.n_valid
    items = [int(i) for i in a["items"][:n]]
    for row, item in enumerate(items):
        entry, want = entries[item], expected[item]
        assert tables["speakers"][a["speaker"][row]] == entry.speaker, (row, item)
        assert tables["languages"][a["language"][row]] == entry.language, (row, item)
        t, f = int(a["text_lens"][row]), int(a["mel_lens"][row])
        assert np.array_equal(a["tokens"][row, :t], want.tokens), (row, item)
        assert f == len(want.mel) and same_rows(a["mel"][row, :f], want.mel), (row, item)
    pad_speaker, pad_language = padding_ids(cfg)  # reserved: no name has them
    assert (a["speaker"][n:] == pad_speaker).all() and (a["language"][n:] == pad_language).all()
    assert a["valid"][:n].all() and not a["valid"][n:].any()
    return items


@pytest.mark.parametrize("tokens", ["chars", "phonemes"])
def test_every_row_has_its_entrys_speaker_and_language_across_a_restart(
    tmp_path: Path, tokens: str
) -> None:
    cfg_path = config(tmp_path, manifest(tmp_path / "train.jsonl"), tokens)
    cfg = load_config(cfg_path)
    entries = open_corpus(cfg).entries
    pipe = SamplePipeline(replace(cfg, features={"cache": False}))
    expected = [pipe(e) for e in entries]
    run_id = rid()
    with started(cfg_path, tmp_path, run_id=run_id, timeout_s=60) as (run, client):
        tables = json.loads((run.dir / IDS_FILE).read_text())
        assert tables == {"speakers": sorted(SPEAKERS), "languages": sorted(LANGUAGES)}
        items: list[int] = []
        while (batch := client.next(timeout_s=90)) is not None:
            items += check_rows(batch, entries, expected, tables, cfg)
            client.free(batch)
            if len(items) >= 12 and run.launches == 2:  # the stager dies mid-epoch
                run.signal("stager", 9)
                run.wait("stager", 10)
                run.start("stager")
        client.close()
        assert run.wait("stager", 30) == 0, run.logs()
        assert json.loads((run.dir / IDS_FILE).read_text()) == tables  # kept, not rebuilt
    assert run.launches == 3, "the stager was never restarted"
    assert collections.Counter(items) == collections.Counter(range(32)), "each item once"
    assert shm_segments(run_id) == []

    # The same run against a corpus with a speaker it has never seen: refused by name.
    manifest(tmp_path / "train.jsonl", extra_speaker="newcomer")
    with Run(cfg_path, run_id, tmp_path) as again:
        again.start("stager")
        assert again.wait("stager", 60) == 2
        logs = again.logs()
    assert "speakers 'newcomer'" in logs and "data.new_ids: append" in logs
