"""Lhotse manifests (shared/corpus/formats/lhotse.py), as lhotse 1.33 wrote them
(tests/data/lhotse/write_manifests.py): recordings with supervisions, or cuts, gzipped or
not, offsets and durations honoured, speaker and language from the supervision; a bad
line costs itself; a manifest that cannot be read as the format is one line that says
what to change. (Real runs: tests/process/test_published_e2e.py.)"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.entry import CorpusError
from ringfeed.shared.corpus.open import open_corpus, read_corpus
from tests.support.audio import load_file
from tests.support.published import LHOTSE, lhotse_reference

SUPERVISIONS = LHOTSE / "demo_supervisions_train.jsonl.gz"
RECORDINGS = LHOTSE / "demo_recordings_train.jsonl.gz"
CUTS = LHOTSE / "demo_cuts_train.jsonl"


def lhotse_cfg(path: Path, tmp_path: Path, **data: str) -> Config:
    return replace(
        Config(),
        data={"path": str(path), "format": "lhotse", **data},
        audio={"sample_rate": 16000},
        features={"cache_dir": str(tmp_path / "cache")},
    )


@pytest.mark.parametrize("path", [SUPERVISIONS, RECORDINGS, CUTS, LHOTSE], ids=lambda p: p.name)
def test_supervisions_and_cuts_give_the_clips_lhotse_wrote(tmp_path: Path, path: Path) -> None:
    """The supervisions (named, or found beside their recordings) and the cuts (named, or
    the one cuts manifest of a folder) give the same clips: the reference's."""
    entries, bad = read_corpus(lhotse_cfg(path, tmp_path, language="fa"))
    assert bad == []
    assert {e.item_id: tuple(e) for e in entries} == {
        k: tuple(e) for k, e in lhotse_reference().items()
    }
    assert {e.language for e in entries} == {"de", "en", "fa", "ru"}  # "English" is en


def test_a_segment_is_the_part_of_its_recording(tmp_path: Path) -> None:
    cfg = replace(lhotse_cfg(SUPERVISIONS, tmp_path), audio={"normalize": "none"})
    index = open_corpus(cfg, in_subprocess=False)
    part = index.entry(index.find("de-00-ava-part"))
    whole = load_file(part.audio_path, cfg)
    assert np.array_equal(load_file(part.audio_path, cfg, part.segment), whole[8000:24000])


def lines_of(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_lines(path: Path, objects: list) -> Path:
    text = "\n".join(o if isinstance(o, str) else json.dumps(o) for o in objects) + "\n"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


def test_a_bad_line_costs_itself(tmp_path: Path) -> None:
    recordings, sups = lines_of(RECORDINGS), lines_of(SUPERVISIONS)
    for rec in recordings:  # the copy's audio paths: absolute, wherever it is
        rec["sources"][0]["source"] = str((LHOTSE / rec["sources"][0]["source"]).resolve())
    sped = {**recordings[0], "id": "sped", "transforms": [{"name": "Speed", "kwargs": {}}]}
    stereo = {**recordings[1], "id": "stereo", "channel_ids": [0, 1]}  # a conversation
    write_lines(tmp_path / "x_recordings_a.jsonl.gz", [*recordings, sped, stereo])
    damaged = [
        {**sups[0], "id": "no-text", "text": " "},
        {**sups[0], "id": "no-recording", "recording_id": "gone"},
        {**sups[0], "id": "sped-up", "recording_id": "sped"},
        {**sups[0], "id": "klingon", "language": "Klingon"},
        {**sups[0], "id": "empty", "duration": 0},
        {**sups[0], "id": "backwards", "start": -1.0},
        "{not json",
        {**sups[0], "id": "left", "recording_id": "stereo", "channel": 0},
        {**sups[0], "id": "right", "recording_id": "stereo", "channel": 1},
    ]
    write_lines(tmp_path / "x_supervisions_a.jsonl.gz", [*sups, *damaged])
    entries, bad = read_corpus(lhotse_cfg(tmp_path / "x_supervisions_a.jsonl.gz", tmp_path))
    assert len(entries) == len(sups)
    reasons = {b.item_id: b.reason for b in bad}
    assert list(reasons) == [
        "no-text",
        "no-recording",
        "sped-up",
        "klingon",
        "empty",
        "backwards",
        "",
        "left",
        "right",
    ]
    for item_id, expected in [
        ("no-text", "no 'text'"),
        ("no-recording", "no recording 'gone'"),
        ("sped-up", "transforms ['Speed']"),
        ("klingon", "'language'"),
        ("empty", "an empty clip"),
        ("backwards", "'start' must be >= 0"),
        ("", "not JSON"),
        ("left", "channels 0, 1: ringfeed mixes"),
        ("right", "supervisions on channels 0, 1"),
    ]:
        assert expected in reasons[item_id]
    cuts = lines_of(CUTS)
    for cut in cuts:  # absolute paths, as in the supervisions' copy
        source = cut["recording"]["sources"][0]
        source["source"] = str((LHOTSE / source["source"]).resolve())
    first, second = cuts[0]["supervisions"][0], cuts[1]["supervisions"][0]
    damaged = [
        {**cuts[0], "id": "mixed", "type": "MixedCut"},
        {**cuts[0], "id": "silent", "supervisions": []},
        {**cuts[0], "id": "two", "supervisions": [first, {**second, "speaker": "x"}]},
    ]
    (tmp_path / "c_cuts.jsonl").write_text("\n".join(json.dumps(c) for c in cuts + damaged))
    entries, bad = read_corpus(lhotse_cfg(tmp_path / "c_cuts.jsonl", tmp_path))
    assert len(entries) == len(cuts)
    assert [(b.item_id, b.reason.split(":")[0]) for b in bad] == [
        ("mixed", "a MixedCut is not read"),
        ("silent", "no supervision (no text)"),
        ("two", "supervisions of several speakers or languages (['ava', 'de', 'x'])"),
    ]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            "recordings alone",
            r"^data.path: .*_recordings_a.jsonl.gz holds recordings and no "
            r"supervisions manifest is beside it \(x_supervisions_a.jsonl.gz\)",
        ),
        (
            "supervisions alone",
            r"^data.path: no recordings manifest beside .*expected "
            r"x_recordings_a.jsonl.gz for",
        ),
        (
            "supervisions misnamed",
            r"^data.path: no recordings manifest beside .*sups.jsonl.gz "
            r"\(expected its name with 'recordings' for 'supervisions'",
        ),
        (
            "two in a folder",
            r"^data.path: .* holds no single cuts or supervisions manifest "
            r"\(found: x_supervisions_a.jsonl.gz, y_supervisions_b.jsonl.gz\)",
        ),
        (
            "not lhotse",
            r"^data.path: .*'s first line is no Lhotse recording, supervision or cut "
            r"\(audio, text; ",
        ),
    ],
)
def test_what_is_not_a_lhotse_corpus_is_one_line(tmp_path: Path, damage: str, message: str) -> None:
    path = tmp_path / "x_recordings_a.jsonl.gz"
    if damage == "recordings alone":
        shutil.copy(RECORDINGS, path)
    elif damage == "supervisions alone":
        path = shutil.copy(SUPERVISIONS, tmp_path / "x_supervisions_a.jsonl.gz")
    elif damage == "supervisions misnamed":
        path = shutil.copy(SUPERVISIONS, tmp_path / "sups.jsonl.gz")
    elif damage == "two in a folder":
        for name in ("x_supervisions_a.jsonl.gz", "y_supervisions_b.jsonl.gz"):
            shutil.copy(SUPERVISIONS, tmp_path / name)
        path = tmp_path
    else:
        path = write_lines(tmp_path / "m.jsonl.gz", [{"audio": "a.wav", "text": "t"}])
    with pytest.raises(CorpusError, match=message) as caught:
        open_corpus(lhotse_cfg(Path(path), tmp_path), in_subprocess=False)
    assert "\n" not in str(caught.value)
