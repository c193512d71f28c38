"""Audio that is not what its header says: a WAV cut short (or a valid header over a few
KB of garbage) is refused with its reason by the producers and counted by validate,
never trained as a short clip of noise against its text."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from ringfeed.producer.audio import load_audio, wav_shortfall
from ringfeed.producer.sample import SkipSample
from ringfeed.scripts.corpus_report import corpus_check
from ringfeed.shared.config import Config, replace
from tests.support.paths import WAVS


def wav_bytes(seconds: float, rate: int = 22050) -> bytes:
    out = io.BytesIO()
    noise = np.random.default_rng(0).standard_normal(int(seconds * rate)) * 0.1
    sf.write(out, noise.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def test_a_wav_body_shorter_than_its_header_is_found() -> None:
    whole = wav_bytes(2.0)
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
        load_audio(str(path), Config())
    with pytest.raises(SkipSample, match="^truncated audio file"):  # as a tar shard member
        load_audio(str(tmp_path / "shard.tar"), Config(), member=body)
    assert len(load_audio(str(WAVS / "LJ001-0002.wav"), Config())) > 0


def test_validate_counts_truncated_files_as_unusable(tmp_path: Path) -> None:
    data = tmp_path / "c"
    shutil.copytree(WAVS.parent, data)
    for name in ("LJ001-0002", "LJ001-0003"):
        raw = (data / "wavs" / f"{name}.wav").read_bytes()
        (data / "wavs" / f"{name}.wav").write_bytes(raw[: len(raw) // 2])
    cfg = replace(Config(), data={"path": str(data)}, features={"on_too_long": "truncate",
                  "cache_dir": str(tmp_path / "cache")})  # fmt: skip
    report = corpus_check(cfg)
    assert report.usable == 14, report.lines
    assert any("skip        2 shorter than its header says" in line for line in report.lines)
