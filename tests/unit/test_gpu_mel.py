"""TfLogMel (stager-side features) agrees with the producers' librosa log-mel."""

from __future__ import annotations

import librosa
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from ringfeed.consumer.stager.gpu_mel import MEL_ATOL, MEL_ATOL_ALL, MEL_COMPARE_FLOOR, TfLogMel  # noqa: E402
from ringfeed.shared.config import Config, replace  # noqa: E402
from ringfeed.shared.sample.content import LOG_FLOOR  # noqa: E402
from tests.support.paths import WAVS  # noqa: E402

pytestmark = pytest.mark.usefixtures("tf_single_threaded")


def _clips(sample_rate: int) -> list[np.ndarray]:
    """Two real LJSpeech clips when the mini dataset is present, else two structured signals."""
    wavs = sorted(WAVS.glob("*.wav"))[:2] if WAVS.is_dir() else []
    if len(wavs) == 2:
        return [librosa.load(p, sr=sample_rate)[0].astype(np.float32) for p in wavs]
    rng = np.random.default_rng(0)
    clips = []
    for seconds, f0 in [(1.7, 110.0), (2.3, 220.0)]:
        t = np.arange(int(seconds * sample_rate)) / sample_rate
        chirp = 0.5 * np.sin(2 * np.pi * (f0 * t + 400.0 * t**2))
        clips.append((chirp + 0.05 * rng.standard_normal(t.size)).astype(np.float32))
    return clips


def _librosa_log_mel(y: np.ndarray, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """(log-mel [frames, n_mels], linear mel [frames, n_mels]) as the producers compute it."""
    f = cfg.features
    mel = librosa.feature.melspectrogram(
        y=y,
        sr=cfg.audio.sample_rate,
        n_fft=f.n_fft,
        hop_length=f.hop_length,
        win_length=f.win_length,
        window="hann",
        center=True,
        pad_mode="constant",
        power=1.0,
        n_mels=f.n_mels,
        fmin=f.fmin,
        fmax=f.fmax,
        htk=False,
        norm="slaney",
    )
    return np.log(np.maximum(mel, LOG_FLOOR)).T, mel.T


@pytest.mark.parametrize("win_length", [1024, 800])
def test_tf_log_mel_matches_librosa(win_length: int) -> None:
    base = Config()
    clips = _clips(base.audio.sample_rate)
    hop = base.features.hop_length
    max_frames = max(1 + c.size // hop for c in clips) + 1
    cfg = replace(
        base,
        stager={"batch_size": 2},
        features={"max_frames": max_frames, "win_length": win_length},
    )
    waves = np.zeros((2, cfg.max_samples), np.float32)
    # Garbage past the true length must not leak into the features.
    waves[:] = 0.3
    for i, c in enumerate(clips):
        waves[i, : c.size] = c
    lens = np.array([c.size for c in clips], np.int32)

    mel, mel_lens = TfLogMel(cfg)(waves, lens)
    mel, mel_lens = mel.numpy(), mel_lens.numpy()

    assert mel.shape == (2, max_frames, cfg.features.n_mels) and mel.dtype == np.float32
    for i, c in enumerate(clips):
        want, linear = _librosa_log_mel(c, cfg)
        n = want.shape[0]
        assert mel_lens[i] == n == 1 + c.size // hop
        loud = linear >= MEL_COMPARE_FLOOR
        assert loud.mean() > 0.5, "comparison floor leaves too few bins"
        err = np.abs(mel[i, :n] - want)
        assert err[loud].max() < MEL_ATOL, f"max log error {err[loud].max():.2e}"
        assert err.max() < MEL_ATOL_ALL, f"max log error on all bins {err.max():.2e}"
        assert np.all(mel[i, n:] == 0.0)
