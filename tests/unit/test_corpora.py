"""Corpus layouts (JSON-lines manifests with segments, LibriTTS, VCTK) and the speaker and
language id tables: stable ids, kept on resume, new names refused or appended."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.pipeline import SamplePipeline
from ringfeed.producer.prepare.prepare import prepare
from ringfeed.producer.text import phonemes
from ringfeed.scripts import cli
from ringfeed.scripts.corpus_report import corpus_report
from ringfeed.shared.config import Config, load_config, replace
from ringfeed.shared.config.loader import ConfigError
from ringfeed.shared.corpus.open import open_corpus, read_corpus
from ringfeed.shared.run.id_tables import IDS_FILE, read_tables, settle_tables
from tests.support.audio import copy_clip, load_file, write_audio
from tests.support.configs import jsonl_cfg
from tests.support.corpora import make_libritts, write_manifest
from tests.support.paths import REPO, WAVS


def test_jsonl_manifest_entries_segments_and_bad_lines(tmp_path: Path) -> None:
    copy_clip(tmp_path / "long.wav", "LJ001-0001")
    manifest = write_manifest(
        tmp_path / "m" / "train.jsonl",
        [
            {"audio": "../long.wav", "text": "Hallo Welt.", "speaker": "ann", "language": "de"},
            {
                "audio": "../long.wav",
                "text": "Zwei.",
                "speaker": "ann",
                "offset": 2.0,
                "duration": 1.5,
                "language": "de",
            },
            {
                "audio_filepath": str(WAVS / "LJ001-0002.wav"),
                "text": "NeMo keys.",
                "lang": "en",
                "speaker": 7,
                "duration": 1.9,
            },
            {"audio": "../long.wav", "text": "Kein Sprecher.", "id": "own-id"},
            "{not json",
            "[1, 2]",
            {"audio": "../long.wav"},
            {"audio": "../long.wav", "text": "x", "language": "Deutsch"},
            {"audio": "../long.wav", "text": "x", "offset": -1},
            {"audio": "../gone.wav", "text": "x"},
            {"audio": "../long.wav", "text": "again", "offset": 2.0},
        ],
    )
    entries, bad = read_corpus(jsonl_cfg(manifest, language="fa"))
    got = [(e.item_id, e.speaker, e.language, e.segment) for e in entries]
    assert got == [
        ("../long", "ann", "de", None),
        ("../long@2.000", "ann", "de", (2.0, 1.5)),
        # An absolute path: its id counts from the manifest's folder (the corpus root);
        # NeMo's duration without an offset is no cut.
        (os.path.relpath(WAVS / "LJ001-0002", tmp_path / "m"), "7", "en", None),
        ("own-id", "", "fa", None),  # data.language for an entry that names none
    ]
    assert entries[0].audio_path == str(tmp_path / "long.wav")
    reasons = [(b.line, b.reason) for b in bad]
    assert [line for line, _ in reasons] == [5, 6, 7, 8, 9, 10, 11]
    for (_, reason), expected in zip(
        reasons,
        [
            "not JSON",
            "expected a JSON object",
            "'text'",
            "'language' must be a code",
            "'offset' must be",
            "audio file not found",
            "duplicate item id",
        ],
        strict=True,
    ):
        assert expected in reason


def test_a_segment_is_decoded_alone_and_cached_apart(tmp_path: Path) -> None:
    cfg = replace(Config(), features={"cache_dir": str(tmp_path / "cache"), "max_frames": 1000})
    whole = load_file(str(WAVS / "LJ001-0001.wav"), replace(cfg, audio={"normalize": "none"}))
    part = load_file(
        str(WAVS / "LJ001-0001.wav"), replace(cfg, audio={"normalize": "none"}), (2.0, 1.5)
    )
    start = 2 * cfg.audio.sample_rate
    assert np.array_equal(part, whole[start : start + len(part)]) and len(part) == 33075
    manifest = write_manifest(
        tmp_path / "m.jsonl",
        [
            {"audio": str(WAVS / "LJ001-0001.wav"), "text": "a", "offset": 2.0, "duration": 1.5},
            {"audio": str(WAVS / "LJ001-0001.wav"), "text": "b", "offset": 4.0, "duration": 1.0},
            {"audio": str(WAVS / "LJ001-0002.wav"), "text": "c", "offset": 5.0},
        ],
    )
    index = open_corpus(replace(cfg, data={"path": str(manifest), "format": "jsonl"}))
    pipe = SamplePipeline(cfg)
    a, b = pipe(index.entries[0]), pipe(index.entries[1])
    assert a.mel.shape[0] == 1 + 33075 // 256 and b.mel.shape[0] == 1 + 22050 // 256
    assert pipe.counters.mels == 2  # two segments of one file: two cache entries
    assert np.array_equal(SamplePipeline(cfg)(index.entries[0]).mel, a.mel)
    with pytest.raises(Exception, match="past the end of the file"):
        pipe(index.entries[2])


def test_libritts_layout(tmp_path: Path) -> None:
    make_libritts(tmp_path)
    cfg = replace(Config(), data={"path": str(tmp_path), "format": "libritts"})
    entries, bad = read_corpus(cfg)
    assert [(e.item_id, e.speaker, e.text, e.language) for e in entries] == [
        ("19_198_0000_000000", "19", "Normalized 0.", "en"),
        ("19_227_0001_000000", "19", "Normalized 1.", "en"),
        ("84_121_0002_000000", "84", "Normalized 2.", "en"),
    ]
    assert len(bad) == 1 and "audio file not found" in bad[0].reason
    original, _ = read_corpus(replace(cfg, data={"text_column": 1}))
    assert original[0].text == "Original 0!"


def test_vctk_layouts(tmp_path: Path) -> None:
    for k, speaker in enumerate(["p225", "p226"]):
        (tmp_path / "txt" / speaker).mkdir(parents=True)
        (tmp_path / "txt" / speaker / f"{speaker}_001.txt").write_text(f"Please call {k}.\n")
    clip = WAVS / "LJ001-0002.wav"
    write_audio(tmp_path / "wav48_silence_trimmed/p225/p225_001_mic1.flac", clip)
    write_audio(tmp_path / "wav48/p226/p226_001.wav", clip)
    entries, bad = read_corpus(replace(Config(), data={"path": str(tmp_path), "format": "vctk"}))
    assert bad == []
    assert [(e.item_id, e.speaker, e.text) for e in entries] == [
        ("p225_001", "p225", "Please call 0."),
        ("p226_001", "p226", "Please call 1."),
    ]
    assert entries[0].audio_path.endswith("_mic1.flac") and entries[1].audio_path.endswith(".wav")


def corpus(tmp_path: Path, people: list[tuple[str, str]], **data) -> Config:
    lines = [
        {"audio": str(WAVS / f"LJ001-{k + 1:04d}.wav"), "text": "t", "speaker": s, "language": lang}
        for k, (s, lang) in enumerate(people)
    ]
    return jsonl_cfg(write_manifest(tmp_path / "m.jsonl", lines), **data)


def test_id_tables_stable_kept_on_resume_and_new_names_refused_or_appended(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    cfg = corpus(tmp_path, [("zoe", "fa"), ("ann", "de"), ("zoe", "en"), ("bob", "fa")])
    index = open_corpus(cfg)
    tables = settle_tables(cfg, index, run)
    assert tables.speakers == ("ann", "bob", "zoe") and tables.languages == ("de", "en", "fa")
    speaker, language = map(np.asarray, tables.item_ids(index))  # a mapped index reads per item
    assert speaker.tolist() == [2, 0, 2, 1] and language.tolist() == [2, 0, 1, 2]
    assert speaker.dtype == np.int32 and read_tables(run) == tables

    fewer = corpus(tmp_path, [("zoe", "fa")])  # a resume on part of the corpus: same ids
    kept = settle_tables(fewer, open_corpus(fewer), run)
    assert kept == tables and np.asarray(kept.item_ids(open_corpus(fewer))[0]).tolist() == [2]

    more = corpus(tmp_path, [("zoe", "fa"), ("al", "ru"), ("cy", "fa")])
    with pytest.raises(ConfigError, match=r"speakers 'al', 'cy' and languages 'ru'.*new_ids"):
        settle_tables(more, open_corpus(more), run)
    assert read_tables(run) == tables  # a refusal changes nothing
    appended = settle_tables(replace(more, data={"new_ids": "append"}), open_corpus(more), run)
    assert appended.speakers == ("ann", "bob", "zoe", "al", "cy")
    assert appended.languages == ("de", "en", "fa", "ru")

    (run / IDS_FILE).unlink()  # lost: the newest checkpoint's copy is the table
    (run / "checkpoints").mkdir()
    for step, t in ((10, appended), (5, tables)):
        sidecar = {"step": step, "ids": t.to_dict()}
        (run / "checkpoints" / f"ckpt-{step}.json").write_text(json.dumps(sidecar))
    assert read_tables(run) == appended

    small = replace(more, data={"max_speakers": 2})
    with pytest.raises(ConfigError, match="data.max_speakers"):
        settle_tables(small, open_corpus(small), tmp_path / "fresh")


def test_validate_report_names_speakers_languages_and_hours(tmp_path: Path) -> None:
    cfg = corpus(tmp_path, [("zoe", "fa"), ("ann", "de"), ("zoe", "fa")])
    text = "\n".join(corpus_report(cfg, prepare(cfg)))
    assert "3 clips" in text and "speakers      2 (id order): ann (1), zoe (2)" in text
    hours_fa = (9.66 + 9.67) / 3600  # LJ001-0001 and -0003
    assert "languages     2 (id order): de, fa" in text
    assert f"fa                2 clips     {hours_fa:.3f} h" in text


def test_validate_on_the_demo_corpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Speakers, languages with clips and hours, and the vocabulary; phonemes without
    espeak-ng are refused with the line that installs it."""
    monkeypatch.chdir(REPO)  # the demo config's data.path is relative to the repo
    assert cli.main(["validate", "configs/multilingual.yaml"]) == 0
    out = capsys.readouterr().out
    assert "speakers      3 (id order): ava (16), ben (12), cyrus (12)" in out
    assert "languages     4 (id order): de, en, fa, ru" in out
    assert "    fa               10 clips     0.006 h" in out and "vocabulary    89 ids" in out
    assert "all characters of 40 sampled texts are in text.alphabet" in out
    english_only = replace(load_config("configs/multilingual.yaml"), text={"alphabet": "ab c"})
    warning = corpus_report(english_only, prepare(english_only))[-1]
    assert "40 of 40 sampled texts have characters outside" in warning and "ж" in warning
    monkeypatch.setattr(phonemes, "espeak_problem", lambda: "run `apt-get install espeak-ng`")
    raw = (REPO / "configs" / "multilingual.yaml").read_text()
    (tmp_path / "phonemes.yaml").write_text(raw.replace("text:\n", "text:\n  tokens: phonemes\n"))
    assert cli.main(["validate", str(tmp_path / "phonemes.yaml")]) == 2
    assert "apt-get install espeak-ng" in capsys.readouterr().err


def test_every_checkpoint_carries_the_runs_id_tables(tmp_path: Path) -> None:
    import keras

    from ringfeed.consumer.trainer.checkpoint import CheckpointManager

    cfg = corpus(tmp_path, [("zoe", "fa"), ("ann", "de")])
    run = tmp_path / "run"
    run.mkdir()
    tables = settle_tables(cfg, open_corpus(cfg), run)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    CheckpointManager(run, model, keras.optimizers.Adam()).save(7, {}, cfg.to_yaml())
    sidecar = json.loads((run / "checkpoints" / "ckpt-7.json").read_text())
    assert sidecar["ids"] == {"speakers": ["ann", "zoe"], "languages": ["de", "fa"]}
    (run / IDS_FILE).unlink()
    assert read_tables(run) == tables  # the checkpoint's copy stands in


def test_the_registry_knows_every_format_the_config_allows() -> None:
    import typing

    from ringfeed.shared.config.data import DataConfig
    from ringfeed.shared.corpus.registry import FORMATS

    allowed = set(typing.get_args(typing.get_type_hints(DataConfig)["format"]))
    assert set(FORMATS) == allowed
    assert all(name == fmt.name for name, fmt in FORMATS.items())


@pytest.mark.parametrize(
    ("data", "features", "key"),
    [
        ({"format": "ljspeech", "shard_window": 2}, {}, "data.shard_window"),
        ({"format": "jsonl", "path": "s3://bucket/corpus.jsonl"}, {}, "data.path"),
        ({"format": "synthetic"}, {"n_mels": 2}, "features.n_mels"),
        ({"format": "synthetic", "synthetic_items": 8192**2 + 1}, {}, "data.synthetic_items"),
    ],
)
def test_a_setting_the_format_cannot_serve_is_refused_when_it_opens(
    tmp_path: Path, data: dict, features: dict, key: str
) -> None:
    """The format decides what it serves (shared/corpus/format.py check), at every open:
    one line naming the key, before anything is read or built."""
    cfg = replace(Config(), data=data, features={"cache_dir": str(tmp_path), **features})
    with pytest.raises(ConfigError, match=f"^{key}: "):
        open_corpus(cfg)
    assert list(tmp_path.iterdir()) == []
