"""log_mel is librosa's mel definition; the loader resamples and mixes down what it reads."""

from __future__ import annotations

import json
from pathlib import Path

import librosa
import numpy as np
import pytest
import soundfile as sf

from ringfeed.producer.features.mel import fit_length, log_mel, mel_filterbank
from ringfeed.producer.sample import SkipSample
from ringfeed.shared.config import Config, replace
from ringfeed.shared.sample.content import LOG_FLOOR
from tests.support.audio import decode_file, librosa_log_mel, load_file, write_audio
from tests.support.paths import WAVS

CLIP = WAVS / "LJ001-0002.wav"
# Absolute, in log space, everywhere: next to LOG_FLOOR (log -11.5) in the quietest bands
# of loud frames too, where a float32 window or FFT was 1e-3 off (producer/features/fft.py). The
# float64 STFT keeps 9.5e-7 on every shipped clip; the float32 magnitude and matmul remain.
TOLERANCE = 1e-4


def _copies(tmp_path: Path) -> dict[str, Path]:
    flac = write_audio(tmp_path / "clip.flac", CLIP)
    low = write_audio(tmp_path / "clip-16k.wav", CLIP, sample_rate=16000)
    return {"wav": CLIP, "flac": flac, "16k": low}


@pytest.mark.parametrize("kind", ["wav", "flac", "16k"])
def test_log_mel_matches_librosa(tmp_path: Path, kind: str) -> None:
    cfg = Config()
    wave = load_file(str(_copies(tmp_path)[kind]), cfg)
    mel = log_mel(wave, cfg)
    assert mel.dtype == np.float32 and mel.shape == (1 + len(wave) // 256, cfg.features.n_mels)
    _assert_parity(mel, librosa_log_mel(wave, cfg))


def _assert_parity(mel: np.ndarray, ref: np.ndarray) -> int:
    """Parity within TOLERANCE everywhere; -> how many values lie next to the floor (within
    a factor 4.5 of it), where a float32 STFT was 1e-3 off."""
    np.testing.assert_allclose(mel, ref, rtol=0, atol=TOLERANCE)
    return int((ref < np.log(LOG_FLOOR) + 1.5).sum())


def test_log_mel_matches_librosa_on_every_shipped_clip() -> None:
    cfg = replace(Config(), features={"on_too_long": "truncate"})
    near_floor = 0
    for path in sorted(WAVS.glob("*.wav")):
        wave, _ = fit_length(load_file(str(path), cfg), cfg)
        near_floor += _assert_parity(log_mel(wave, cfg), librosa_log_mel(wave, cfg))
    assert near_floor > 1000, "the clips must hold values next to the floor to test them"


def test_filterbank_is_librosa_slaney() -> None:
    cfg = replace(Config(), features={"n_mels": 64, "fmin": 50.0})
    fb = mel_filterbank(cfg)
    ref = librosa.filters.mel(
        sr=22050, n_fft=1024, n_mels=64, fmin=50.0, fmax=8000.0, htk=False, norm="slaney"
    )
    assert fb.shape == (64, 513) and fb.dtype == np.float32
    np.testing.assert_allclose(fb, ref, rtol=1e-6, atol=1e-9)


def test_loader_resamples_mixes_and_normalizes(tmp_path: Path) -> None:
    cfg = Config()
    wave, _ = sf.read(CLIP, dtype="float32")
    stereo = write_audio(tmp_path / "stereo.wav", CLIP, channels=2, subtype="PCM_24")
    out = load_file(str(stereo), cfg)
    assert out.ndim == 1 and out.dtype == np.float32 and len(out) == len(wave)
    assert np.max(np.abs(out)) == pytest.approx(cfg.audio.peak_level, rel=1e-6)
    trimmed = load_file(str(CLIP), replace(cfg, audio={"trim_silence": True, "trim_top_db": 30.0}))
    assert len(trimmed) < len(out)


@pytest.mark.parametrize(
    ("suffix", "subtype"),
    [("wav", "PCM_16"), ("flac", "PCM_16"), ("aiff", "PCM_16"), ("wav", "PCM_24")],
)
def test_decode_gives_libsndfiles_own_float_samples(
    tmp_path: Path, suffix: str, subtype: str
) -> None:
    """16-bit PCM is read as int16 and scaled in numpy (producer/audio/decode.py _read_frames):
    the same float32 samples, bit for bit, as libsndfile's conversion, full scale and
    stereo included; a segment too."""
    speech, _ = sf.read(CLIP, dtype="float32")
    edges = np.array([-1.0, 32767 / 32768, 0.0, 2**-15, -(2**-15)], np.float32)
    both = np.stack([np.concatenate([speech, edges]), np.concatenate([edges, speech])], 1)
    path = write_audio(tmp_path / f"clip.{suffix}", both, subtype=subtype)
    data, sr = decode_file(str(path))
    assert data.dtype == np.float32 and sr == 22050
    np.testing.assert_array_equal(data, sf.read(path, dtype="float32", always_2d=True)[0])
    part, _ = decode_file(str(path), (0.5, 1.0))
    np.testing.assert_array_equal(part, data[11025 : 11025 + 22050])


def test_fit_length_skip_and_truncate() -> None:
    cfg = replace(Config(), features={"max_frames": 10})
    ok, cut = fit_length(np.zeros(cfg.max_samples - 1, np.float32), cfg)
    assert not cut and 1 + len(ok) // 256 == 10
    with pytest.raises(SkipSample, match="11 frames > features.max_frames=10"):
        fit_length(np.zeros(cfg.max_samples, np.float32), cfg)
    trunc = replace(cfg, features={"on_too_long": "truncate"})
    wave, cut = fit_length(np.zeros(5000, np.float32), trunc)
    assert cut and log_mel(wave, trunc).shape[0] == 10


def test_silent_audio_is_skipped(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "silent.wav", "silence", 1.0)
    with pytest.raises(SkipSample, match="silent"):
        load_file(str(path), Config())


def test_mp3_loads_as_the_same_speech(tmp_path: Path) -> None:
    cfg = Config()
    wave, sr = sf.read(CLIP, dtype="float32")
    mp3 = write_audio(tmp_path / "clip.mp3", CLIP, format="MP3", subtype="MPEG_LAYER_III")
    out = load_file(str(mp3), cfg)
    assert out.ndim == 1 and out.dtype == np.float32
    # An MP3 encoder adds some padding at the ends: compare durations, then the speech.
    assert abs(len(out) - len(wave)) < 0.1 * sr
    ref = load_file(str(CLIP), cfg)
    n = min(len(out), len(ref))
    lag = int(np.argmax(np.correlate(out[:4096], ref[:2048], mode="valid")))
    corr = np.corrcoef(out[lag : lag + n - 4096], ref[: n - 4096])[0, 1]
    assert corr > 0.9


@pytest.mark.parametrize(
    ("n_fft", "win_length", "hop"),
    [(1024, 1024, 256), (1024, 800, 200), (512, 400, 160), (2048, 2048, 300)],
)
def test_stft_is_librosa_stft_for_any_window_and_hop(n_fft: int, win_length: int, hop: int) -> None:
    """The producer's STFT is librosa's definition, to the float32 rounding of its
    magnitude (bounded by 1e-6 of the clip's largest bin), with no librosa import."""
    from ringfeed.producer.features.mel import stft_magnitude

    cfg = replace(Config(), features={"n_fft": n_fft, "win_length": win_length, "hop_length": hop})
    wave, _ = sf.read(CLIP, dtype="float32")
    for n in (len(wave), 1, n_fft // 2 + 3):
        ours = stft_magnitude(wave[:n], cfg.features)
        ref = np.abs(
            librosa.stft(
                wave[:n],
                n_fft=n_fft,
                hop_length=hop,
                win_length=win_length,
                window="hann",
                center=True,
                pad_mode="constant",
            )
        ).T
        assert ours.shape == ref.shape and ours.dtype == np.float32
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=max(1e-6 * ref.max(), 1e-7))


@pytest.mark.parametrize(
    ("sr", "n_fft", "n_mels", "fmin", "fmax"),
    [
        (16000, 512, 40, 0.0, 8000.0),
        (24000, 1024, 100, 20.0, 11000.0),
        (44100, 2048, 128, 0.0, 22050.0),
    ],
)
def test_filterbank_is_librosa_for_other_rates(
    sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float
) -> None:
    from ringfeed.producer.features.mel import mel_filterbank

    raw = {
        "audio": {"sample_rate": sr},
        "features": {
            "n_fft": n_fft,
            "win_length": n_fft,
            "n_mels": n_mels,
            "fmin": fmin,
            "fmax": fmax,
        },
    }
    cfg = replace(Config(), **raw)
    ref = librosa.filters.mel(
        sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax, htk=False, norm="slaney"
    )
    np.testing.assert_allclose(mel_filterbank(cfg), ref, rtol=1e-6, atol=1e-9)


def test_reused_work_buffers_never_leak_between_clips() -> None:
    """log_mel reuses per-thread work arrays: a short clip after a long one sees no
    stale frames, and a result is never overwritten by the next call."""
    cfg = Config()
    wave, _ = sf.read(CLIP, dtype="float32")
    long_first = log_mel(wave, cfg)
    short = log_mel(wave[:3000], cfg)
    assert np.array_equal(long_first, log_mel(wave, cfg))  # the first result is intact
    assert short.shape == (1 + 3000 // 256, cfg.features.n_mels)
    np.testing.assert_array_equal(short, log_mel(wave[:3000].copy(), cfg))
    _assert_parity(short, librosa_log_mel(wave[:3000], cfg))


def test_every_fft_the_host_may_choose_gives_the_same_transform() -> None:
    """The producer times the float64 FFT libraries it can import and keeps the fastest
    (producer/features/fft.py): each must compute the same transform, to float64 rounding."""
    from ringfeed.producer.features import fft

    frames = np.random.default_rng(1).standard_normal((40, 1024))
    ref = np.fft.rfft(frames, axis=-1)
    assert set(fft.available()) == set(fft.CANDIDATES)  # both are dependencies
    for name in fft.available():
        out = np.empty_like(ref)
        np.testing.assert_allclose(fft.CANDIDATES[name](frames, out), ref, rtol=0, atol=1e-9)
    name, chosen = fft.fastest(1024)
    assert name in fft.CANDIDATES and chosen is fft.CANDIDATES[name]


def test_the_host_key_names_each_fft_librarys_installed_version() -> None:
    """A new version of an FFT library times the choice again: the host key reads each
    candidate's version from its dist-info folder (not importlib.metadata, ~55 ms of a
    pool's start), the same version importlib.metadata reads."""
    import importlib.metadata

    from ringfeed.producer.features import fft

    for name in fft.available():
        assert fft._version(name) == importlib.metadata.version(name)
    assert fft._version("no-such-distribution") == "?"


def test_the_fft_choice_is_timed_once_per_host_and_kept(tmp_path: Path) -> None:
    """The first process of a host times the candidates and keeps its choice under
    features.cache_dir; the next one reads it (no timing: no scipy.fft import in every
    producer); a choice naming no candidate is timed again."""
    from ringfeed.producer.features import fft

    path = fft.choice_path(512, str(tmp_path))
    name, _ = fft.choose(512, str(tmp_path))
    assert json.loads(path.read_text())["name"] == name
    path.write_text(json.dumps({"name": "scipy" if name == "ducc0" else "ducc0"}))
    assert fft.choose(512, str(tmp_path))[0] != name  # read, not timed again
    path.write_text(json.dumps({"name": "fftw"}))
    assert fft.choose(512, str(tmp_path))[0] in fft.CANDIDATES
    assert json.loads(path.read_text())["name"] in fft.CANDIDATES
    assert fft.choice_path(512, str(tmp_path)) != fft.choice_path(1024, str(tmp_path))


def test_a_stop_while_the_fft_choice_is_kept_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool stopped at its start (StopFlag.raising) can be stopped between the choice's
    temporary file and its replace: the stop goes on, and nothing is left in the cache."""
    from ringfeed.producer.features import fft
    from ringfeed.shared.run.process import Stopped

    def stopped(*_: object) -> None:
        raise Stopped("SIGTERM")

    monkeypatch.setattr(fft.os, "replace", stopped)
    with pytest.raises(Stopped):
        fft.choose(512, str(tmp_path))
    assert list((tmp_path / "fft").iterdir()) == []
