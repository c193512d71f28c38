"""TfLogMel (stager-side features) agrees with the producers' librosa log-mel."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from ringfeed.consumer.stager.gpu_mel import MEL_ATOL, TfLogMel  # noqa: E402
from ringfeed.shared.config import Config, load_config, replace  # noqa: E402
from ringfeed.shared.sample.content import LOG_FLOOR  # noqa: E402
from tests.support.audio import librosa_log_mel, load_file  # noqa: E402
from tests.support.paths import REPO, WAVS  # noqa: E402

pytestmark = pytest.mark.usefixtures("tf_single_threaded")


def _assert_batch_matches_librosa(cfg: Config, clips: list[np.ndarray]) -> int:
    """TfLogMel of the clips as one batch, its slots filled with garbage past each clip's
    length, is librosa's log-mel within MEL_ATOL on every frame inside the length and
    zero after it; -> how many values lie next to the floor (within a factor 4.5)."""
    hop = cfg.features.hop_length
    max_frames = max(1 + c.size // hop for c in clips) + 1
    cfg = replace(cfg, features={"max_frames": max_frames})
    waves = np.full((len(clips), cfg.max_samples), 0.3, np.float32)  # must not leak in
    for i, c in enumerate(clips):
        waves[i, : c.size] = c
    lens = np.array([c.size for c in clips], np.int32)
    mel, mel_lens = (t.numpy() for t in TfLogMel(cfg)(waves, lens))
    assert mel.shape == (len(clips), max_frames, cfg.features.n_mels) and mel.dtype == np.float32
    near_floor = 0
    for i, c in enumerate(clips):
        want = librosa_log_mel(c, cfg)
        n = want.shape[0]
        assert mel_lens[i] == n == 1 + c.size // hop
        np.testing.assert_allclose(mel[i, :n], want, rtol=0, atol=MEL_ATOL)
        assert np.all(mel[i, n:] == 0.0)
        near_floor += int((want < np.log(LOG_FLOOR) + 1.5).sum())
    return near_floor


@pytest.mark.parametrize("win_length", [1024, 800])
def test_tf_log_mel_matches_librosa(win_length: int) -> None:
    cfg = replace(Config(), features={"win_length": win_length, "max_frames": 1200})
    clips = [load_file(str(p), cfg) for p in sorted(WAVS.glob("*.wav"))[:2]]
    _assert_batch_matches_librosa(cfg, clips)


def test_tf_log_mel_matches_librosa_next_to_the_floor_on_the_multilingual_clips() -> None:
    """The demo's 16 kHz clips hold ~12 % of their values next to LOG_FLOOR, in the
    quietest bands of loud frames, where a float32 STFT was 1.5e-4 off."""
    cfg = load_config(REPO / "configs" / "multilingual.yaml")
    paths = sorted((REPO / "data" / "multilingual-demo" / "clips").glob("*.flac"))
    near_floor = 0
    for batch in (paths[:20], paths[20:]):
        near_floor += _assert_batch_matches_librosa(cfg, [load_file(str(p), cfg) for p in batch])
    assert near_floor > 10_000, "the clips must hold values next to the floor to test them"
