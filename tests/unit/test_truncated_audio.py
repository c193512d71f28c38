"""Audio that is not what its header says: a WAV, RF64, Wave64 or AIFF file cut short (or
a valid header over a few KB of garbage, or after large chunks), an MP3 that decodes
short of its header, a manifest segment past its file's end: refused with its reason by
the producers and counted by validate, never trained as a short clip against its text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.audio.containers import shortfall
from ringfeed.producer.audio.decode import load_audio
from ringfeed.producer.prepare.prepare import prepare
from ringfeed.producer.sample import SkipSample
from ringfeed.scripts.corpus_report import corpus_check
from ringfeed.shared.config import Config, replace
from ringfeed.shared.corpus.clips import Clip
from tests.support.audio import audio_bytes, decode_file, judge_file, load_file
from tests.support.paths import WAVS


def wav_shortfall(data: bytes, size: int) -> tuple[float, float] | None:
    return shortfall(lambda at, n: data[at : at + n], size)


def test_a_wav_body_shorter_than_its_header_is_found() -> None:
    whole = audio_bytes("noise", 2.0, subtype="PCM_16")
    assert wav_shortfall(whole, len(whole)) is None
    cut = whole[:44] + np.random.default_rng(1).bytes(20_000)  # header over garbage
    declared, held = wav_shortfall(cut, len(cut))
    assert declared == pytest.approx(2.0) and held == pytest.approx(20_000 / 2 / 22050)
    streamed = whole[:40] + (0xFFFFFFFF).to_bytes(4, "little") + whole[44:1000]
    assert wav_shortfall(streamed, len(streamed)) is None  # a stream's unknown length
    assert wav_shortfall(b"fLaC" + whole[4:], len(whole)) is None  # not a WAV: not judged


@pytest.mark.parametrize("how", ["cut", "garbage"])
def test_a_truncated_wav_is_skipped_with_its_reason(tmp_path: Path, how: str) -> None:
    whole = (WAVS / "LJ001-0002.wav").read_bytes()
    body = whole[: len(whole) // 3] if how == "cut" else whole[:44] + bytes(range(256)) * 80
    path = tmp_path / "short.wav"
    path.write_bytes(body)
    with pytest.raises(SkipSample, match="^truncated audio file: its header says"):
        load_file(str(path), Config())
    with pytest.raises(SkipSample, match="^truncated audio file"):  # as a tar shard member
        load_audio(Clip(str(tmp_path / "shard.tar"), None, len(body), data=body), Config())
    assert len(load_file(str(WAVS / "LJ001-0002.wav"), Config())) > 0


def test_validate_counts_truncated_files_as_unusable(tmp_path: Path) -> None:
    data = tmp_path / "c"
    shutil.copytree(WAVS.parent, data)
    for name in ("LJ001-0002", "LJ001-0003"):
        raw = (data / "wavs" / f"{name}.wav").read_bytes()
        (data / "wavs" / f"{name}.wav").write_bytes(raw[: len(raw) // 2])
    cfg = replace(
        Config(),
        data={"path": str(data)},
        features={"on_too_long": "truncate", "cache_dir": str(tmp_path / "cache")},
    )
    report = corpus_check(cfg, prepare(cfg))
    assert report.usable == 14, report.lines
    assert any("skip        2 shorter than its header says" in line for line in report.lines)


def encoded(fmt: str, subtype: str) -> bytes:
    """The first 3 s of a shipped clip's speech in that container and encoding."""
    return audio_bytes(WAVS / "LJ001-0004.wav", 3.0, subtype=subtype, format=fmt)


def with_chunk_first(wav: bytes, size: int = 9000) -> bytes:
    """A LIST chunk of `size` bytes between fmt and data, as taggers write (more than the
    first few KB of the file before the data chunk)."""
    chunk = b"LIST" + size.to_bytes(4, "little") + b"INFO" + bytes(size - 4)
    out = wav[:36] + chunk + wav[36:]
    return out[:4] + (len(out) - 8).to_bytes(4, "little") + out[8:]


@pytest.mark.parametrize(
    "fmt, subtype",
    [
        ("WAV", "PCM_24"),
        ("WAV", "FLOAT"),
        ("RF64", "PCM_16"),
        ("W64", "PCM_16"),
        ("AIFF", "PCM_16"),
        ("MP3", "MPEG_LAYER_III"),
        ("LIST", "PCM_16"),
    ],
)
def test_every_container_cut_short_is_refused_and_whole_it_reads(
    tmp_path: Path, fmt: str, subtype: str
) -> None:
    whole = with_chunk_first(encoded("WAV", subtype)) if fmt == "LIST" else encoded(fmt, subtype)
    path = tmp_path / f"clip.{fmt.lower()}"
    path.write_bytes(whole)
    assert len(load_file(str(path), Config())) > 2.5 * 22050
    path.write_bytes(whole[: int(len(whole) * 0.8)])
    with pytest.raises(SkipSample, match=r"^truncated audio file: its header says 3\.00 s"):
        load_file(str(path), Config())


def test_a_segment_past_its_files_end_is_refused(tmp_path: Path) -> None:
    """A manifest's segment that runs past the file: refused from the header, and after
    the decode where no header tells; a rounded duration (a few ms past) reads."""
    path = tmp_path / "clip.wav"
    path.write_bytes(encoded("WAV", "PCM_16"))
    with pytest.raises(SkipSample, match=r"segment 1\.00-3\.50 s runs past the end"):
        judge_file(str(path), Config(), (1.0, 2.5))
    wave, _ = judge_file(str(path), Config(), (1.0, 2.004))
    assert abs(len(wave) - 2.0 * 22050) <= 1
    with pytest.raises(SkipSample, match="runs past the end"):  # decode's own check
        decode_file(str(path), (1.0, 2.5))


def test_validate_counts_a_segment_past_its_files_end_as_the_producers_do(tmp_path: Path) -> None:
    (tmp_path / "clip.wav").write_bytes(encoded("WAV", "PCM_16"))  # 3.00 s
    lines = [
        {"id": "past", "audio": "clip.wav", "text": "past", "offset": 1.0, "duration": 2.5},
        {"id": "rounded", "audio": "clip.wav", "text": "rounded", "offset": 1.0, "duration": 2.004},
        {"id": "inside", "audio": "clip.wav", "text": "inside", "offset": 0.5, "duration": 1.0},
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    cfg = replace(
        Config(),
        data={"path": str(manifest), "format": "jsonl"},
        features={"cache_dir": str(tmp_path / "cache")},
    )
    report = corpus_check(cfg, prepare(cfg))
    assert report.usable == 2, report.lines
    assert any("segment runs past its file's end" in line for line in report.lines)
