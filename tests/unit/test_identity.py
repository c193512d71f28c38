"""Identities that travel (contract 12): item ids, speakers and the corpus digest do not
depend on where the corpus lives, absolute audio paths included. NeMo manifests as NeMo
writes them (a .json name, a rounded duration that is no cut). (A producer whose copy
of the corpus lives elsewhere joins, and a moved corpus resumes its plan:
tests/process/test_identity.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import soundfile as sf

from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.shared.config import Config, ConfigError, replace
from ringfeed.shared.corpus.open import build_in_memory, open_corpus, read_corpus
from ringfeed.shared.run.fingerprint import plan_fingerprint
from tests.support.absolute_corpus import CLIPS, make_absolute_corpus
from tests.support.paths import REPO, WAVS


def cfg_of(manifest: Path, fmt: str, **data: str) -> Config:
    return replace(
        Config(),
        data={"path": str(manifest), "format": fmt, **data},
        features={"cache_dir": str(manifest.parent / "cache")},
    )


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_the_same_corpus_at_two_paths_is_one_corpus(tmp_path: Path, fmt: str) -> None:
    """Absolute audio paths in the metadata, the whole corpus copied elsewhere with its
    paths rewritten: the same ids (counted from the metadata's folder), speakers, digest
    and plan; each copy's entries point into their own folder."""
    here, there = (
        cfg_of(make_absolute_corpus(tmp_path / side, fmt), fmt) for side in ("here", "there")
    )
    a, b = open_corpus(here, in_subprocess=False), open_corpus(there, in_subprocess=False)
    ids = [a.item_id(k) for k in range(a.n_items)]
    assert ids == [f"wavs/{name}" for name in CLIPS] == [b.item_id(k) for k in range(b.n_items)]
    assert a.digest == b.digest and a.speakers == b.speakers == ("spk0", "spk1")
    assert plan_fingerprint(here, a, [], []) == plan_fingerprint(there, b, [], [])
    assert b.entry(0).audio_path == str(tmp_path / "there" / "wavs" / f"{CLIPS[0]}.wav")


def test_data_root_is_what_ids_count_from_when_the_manifest_lives_apart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A manifest in meta/ listing absolute paths under the corpus's top folder: without
    data.root the index says the ids depend on the mount and to set it; with data.root
    the ids count from that folder, and a copy of the whole tree elsewhere has the same
    digest; formats whose paths are fixed refuse data.root."""
    apart = make_absolute_corpus(tmp_path / "apart", "jsonl", manifest_in="meta")
    with caplog.at_level("WARNING"):
        assert open_corpus(cfg_of(apart, "jsonl"), in_subprocess=False).item_id(0).startswith("../")
    said = [r.getMessage() for r in caplog.records if "outside the corpus root" in r.getMessage()]
    assert len(said) == 1 and f"{len(CLIPS)} clips" in said[0] and "set data.root" in said[0]
    sides = []
    for side in ("one", "two"):
        manifest = make_absolute_corpus(tmp_path / side, "jsonl", manifest_in="meta")
        sides.append(cfg_of(manifest, "jsonl", root=str(tmp_path / side)))
    a, b = (open_corpus(cfg, in_subprocess=False) for cfg in sides)
    assert a.item_id(0) == f"wavs/{CLIPS[0]}" and a.digest == b.digest
    assert a.root == str(tmp_path / "one")
    entries, bad = read_corpus(sides[1])
    assert bad == [] and entries[0].audio_path == str(tmp_path / "two" / "wavs" / f"{CLIPS[0]}.wav")
    ljspeech = replace(Config(), data={"root": str(tmp_path)})
    with pytest.raises(ConfigError, match="^data.root: only data.format jsonl and csv"):
        open_corpus(ljspeech)


def test_nemos_rounded_duration_cuts_nothing(tmp_path: Path) -> None:
    """NeMo writes duration rounded (1.0 here for clips of 1.9-10 s): without an offset
    it is no cut, the producer decodes the whole clip; with one it is the segment's."""
    manifest = make_absolute_corpus(tmp_path / "c", "jsonl")
    cfg = replace(cfg_of(manifest, "jsonl"), features={"cache": False, "max_frames": 2000})
    index = build_in_memory(cfg)
    pipe = SamplePipeline(cfg, index=index)
    for k, name in enumerate(CLIPS):
        entry = index.entry(k)
        assert entry.segment is None
        frames = 1 + sf.info(WAVS / f"{name}.wav").frames // 256  # 22.05 kHz, as decoded
        assert abs(len(pipe(entry, k).mel) - frames) <= 1, name
    lines = manifest.read_text().splitlines()
    cut = json.loads(lines[0]) | {"offset": 0.5}
    manifest.write_text("\n".join([json.dumps(cut), *lines[1:]]) + "\n")
    assert build_in_memory(cfg).entry(0).segment == (0.5, 1.0)


def test_a_json_lines_manifest_under_another_format_says_to_set_jsonl(tmp_path: Path) -> None:
    manifest = make_absolute_corpus(tmp_path / "c", "jsonl")
    shutil.copy(manifest, tmp_path / "c" / "metadata.csv")
    entries, bad = read_corpus(replace(Config(), data={"path": str(tmp_path / "c")}))
    assert entries == [] and len(bad) == len(CLIPS)
    assert all(b.reason.endswith("(the line looks like JSON: set data.format: jsonl)") for b in bad)


@pytest.mark.parametrize("fmt", ["commonvoice", "parquet", "hub", "lhotse"])
def test_a_published_corpus_moved_is_the_same_corpus(tmp_path: Path, fmt: str) -> None:
    """A Common Voice release, a folder of Parquet files (one whose base names repeat
    across shards: ids by file and name, docs/corpora.md#item-ids) or Lhotse cuts with the
    audio they name (by relative paths that leave the manifest's folder) copied elsewhere:
    the same ids, speakers, digest and plan; each copy's entries point into their own
    tree."""
    from tests.support.published import HUB, LHOTSE, PARQUET, write_commonvoice

    sides = []
    for side in ("here", "there"):
        if fmt == "commonvoice":
            write_commonvoice(tmp_path / side, "fa")
            path = tmp_path / side / "fa"
        elif fmt in ("parquet", "hub"):
            path = Path(
                shutil.copytree(
                    PARQUET if fmt == "parquet" else HUB,
                    tmp_path / side / "hf",
                    ignore=shutil.ignore_patterns("*.py"),
                )
            )
        else:  # its sources are ../../../data/multilingual-demo/clips/*.flac
            manifests = tmp_path / side / "tests" / "data" / "lhotse"
            shutil.copytree(LHOTSE, manifests, ignore=shutil.ignore_patterns("*.py", "__py*"))
            clips = REPO / "data" / "multilingual-demo" / "clips"
            shutil.copytree(clips, tmp_path / side / "data" / "multilingual-demo" / "clips")
            path = manifests / "demo_cuts_train.jsonl"
        fmt_name = "parquet" if fmt == "hub" else fmt
        sides.append(
            replace(
                Config(),
                data={"path": str(path), "format": fmt_name},
                features={"cache_dir": str(tmp_path / side / "cache")},
            )
        )
    a, b = (open_corpus(cfg, in_subprocess=False) for cfg in sides)
    assert [a.item_id(k) for k in range(a.n_items)] == [b.item_id(k) for k in range(b.n_items)]
    assert a.digest == b.digest and a.speakers == b.speakers and a.n_items > 0
    assert plan_fingerprint(sides[0], a, [], []) == plan_fingerprint(sides[1], b, [], [])
    assert b.entry(0).audio_path.startswith(str(tmp_path / "there"))
    assert fmt != "hub" or a.n_items == 8  # every row of both shards, each under its own id
