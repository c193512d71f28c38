"""The stager's batch log-mel (features.device: stager) in each framework agrees with the
producers' librosa log-mel, keeps its face and compiles once per shape.

One parametrized test per contract over torch, JAX and TensorFlow, each on the CPU here
(a framework not installed skips); they share one definition of the log-mel
(shared/sample/mel_definition.py), so a backend that drifts from it fails here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ringfeed.consumer.stager.gpu_mel import MEL_ATOL, BatchLogMel, MelInputError
from ringfeed.shared.config import Config, load_config, replace
from ringfeed.shared.sample.content import LOG_FLOOR
from tests.support.audio import librosa_log_mel, load_file
from tests.support.paths import REPO, WAVS

# numpy: the CPU fallback where the device's mels fail mid-run (consumer/stager/numpy_mel.py).
FRAMEWORKS = ("torch", "jax", "tf", "numpy")


def make_log_mel(
    framework: str, cfg: Config, request: pytest.FixtureRequest, gpu: bool = False
) -> BatchLogMel:
    """The stager's log-mel in `framework` on the CPU, or on the GPU (skips without one);
    skips where the framework is not installed. Each framework runs on one thread: the
    2 cores are shared with other tests' processes."""
    if framework == "numpy":
        if gpu:
            pytest.skip("numpy has no GPU")
        from ringfeed.consumer.stager.numpy_mel import NumpyLogMel

        return NumpyLogMel(cfg)
    if framework == "torch":
        torch = pytest.importorskip("torch")
        from ringfeed.consumer.stager.torch_mel import TorchLogMel

        if gpu and not torch.cuda.is_available():
            pytest.skip("torch sees no GPU")
        torch.set_num_threads(1)
        return TorchLogMel(cfg, "cuda" if gpu else "cpu")
    if framework == "jax":
        jax = pytest.importorskip("jax")  # one thread: tests/conftest.py's XLA_FLAGS
        from ringfeed.consumer.stager.jax_mel import JaxLogMel

        try:
            device = jax.devices("gpu" if gpu else "cpu")[0]
        except RuntimeError:  # no backend of that kind
            pytest.skip("JAX sees no GPU")
        return JaxLogMel(cfg, device)
    tf = pytest.importorskip("tensorflow")
    request.getfixturevalue("tf_single_threaded")
    from ringfeed.consumer.stager.tf_mel import TfLogMel

    if gpu and not tf.config.list_logical_devices("GPU"):  # else it takes the GPU it sees
        pytest.skip("TensorFlow sees no GPU")
    return TfLogMel(cfg)


# (path, audio, features) -> (the clip as producers load it, librosa's log-mel of it):
# once per test process for every framework.
_CLIPS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _clip(path: Path, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    key = (path, cfg.audio, cfg.features)
    if key not in _CLIPS:
        wave = load_file(str(path), cfg)
        _CLIPS[key] = wave, librosa_log_mel(wave, cfg)
    return _CLIPS[key]


def _assert_batch_matches_librosa(mel_fn: BatchLogMel, cfg: Config, paths: list[Path]) -> int:
    """mel_fn of the clips as one batch, its rows filled with garbage past each clip's
    length, is librosa's log-mel within MEL_ATOL on every frame inside the length and
    zero after it, as numpy float32 and int32; -> how many values lie next to the floor
    (within a factor 4.5)."""
    clips, wants = zip(*(_clip(p, cfg) for p in paths), strict=True)
    hop, n_mels = cfg.features.hop_length, cfg.features.n_mels
    n_frames = max(1 + c.size // hop for c in clips) + 1
    waves = np.full((len(clips), n_frames * hop), 0.3, np.float32)  # must not leak in
    for i, c in enumerate(clips):
        waves[i, : c.size] = c
    lens = np.array([c.size for c in clips], np.int32)
    mel, mel_lens = mel_fn(waves, lens)
    assert isinstance(mel, np.ndarray) and isinstance(mel_lens, np.ndarray)
    assert mel.shape == (len(clips), n_frames, n_mels) and mel.dtype == np.float32
    assert mel_lens.dtype == np.int32
    near_floor = 0
    for i, want in enumerate(wants):
        n = want.shape[0]
        assert mel_lens[i] == n == 1 + clips[i].size // hop
        np.testing.assert_allclose(mel[i, :n], want, rtol=0, atol=MEL_ATOL)
        assert np.all(mel[i, n:] == 0.0)
        near_floor += int((want < np.log(LOG_FLOOR) + 1.5).sum())
    return near_floor


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(
    "features",
    [{}, {"win_length": 800}, {"win_length": 800, "hop_length": 200}],
    ids=["default", "win800", "hop200"],  # hop200: 1024 frames not a whole number of hops
)
def test_log_mel_matches_librosa(
    framework: str, features: dict, request: pytest.FixtureRequest
) -> None:
    cfg = replace(Config(), features={**features, "max_frames": 1500})
    mel_fn = make_log_mel(framework, cfg, request)
    _assert_batch_matches_librosa(mel_fn, cfg, sorted(WAVS.glob("*.wav"))[:2])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_log_mel_matches_librosa_next_to_the_floor_on_the_multilingual_clips(
    framework: str, request: pytest.FixtureRequest
) -> None:
    """The demo's 16 kHz clips hold ~12 % of their values next to LOG_FLOOR, in the
    quietest bands of loud frames, where a float32 STFT was 1.5e-4 off."""
    cfg = load_config(REPO / "configs" / "multilingual.yaml")
    mel_fn = make_log_mel(framework, cfg, request)
    paths = sorted((REPO / "data" / "multilingual-demo" / "clips").glob("*.flac"))
    near_floor = 0
    for batch in (paths[:20], paths[20:]):
        near_floor += _assert_batch_matches_librosa(mel_fn, cfg, batch)
    assert near_floor > 10_000, "the clips must hold values next to the floor to test them"


@pytest.mark.gpu
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_log_mel_on_the_gpu_matches_librosa(framework: str, request: pytest.FixtureRequest) -> None:
    """The same on the GPU: cuFFT in float64, and the filterbank matmul never in TF32."""
    cfg = load_config(REPO / "configs" / "multilingual.yaml")
    mel_fn = make_log_mel(framework, cfg, request, gpu=True)
    paths = sorted((REPO / "data" / "multilingual-demo" / "clips").glob("*.flac"))
    _assert_batch_matches_librosa(mel_fn, cfg, paths[:20])


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_shape_is_traced_once(framework: str, request: pytest.FixtureRequest) -> None:
    """The stager calls its mels once a batch: JAX traces (and compiles) once per batch
    shape, a bucket's, not per call; TensorFlow's one trace serves every shape. JAX's
    float64 stays inside the mels: the process's own arrays keep their dtypes."""
    cfg = replace(Config(), features={"max_frames": 40})
    mel_fn = make_log_mel(framework, cfg, request)
    hop = cfg.features.hop_length
    rng = np.random.default_rng(0)
    for rows, frames, want in [(4, 40, 1), (4, 40, 1), (3, 40, 2), (4, 40, 2), (4, 20, 3)]:
        waves = rng.standard_normal((rows, frames * hop)).astype(np.float32)
        mel_fn(waves, rng.integers(0, frames * hop, rows).astype(np.int32))
        assert mel_fn.traces == (want if framework == "jax" else 1), (rows, frames)
    if framework == "jax":
        import jax.numpy as jnp

        assert jnp.ones(2, float).dtype == jnp.float32


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_batch_of_another_shape_or_dtype_is_refused_before_any_work(
    framework: str, request: pytest.FixtureRequest
) -> None:
    """A batch that breaks the face raises MelInputError (a ValueError) saying what is
    wrong, the same in every framework (consumer/stager/gpu_mel.py says what the stager
    does with it)."""
    cfg = replace(Config(), features={"max_frames": 8})
    mel_fn = make_log_mel(framework, cfg, request)
    n = 8 * cfg.features.hop_length
    waves, lens = np.zeros((2, n), np.float32), np.array([n // 2, n], np.int32)
    for bad_waves, bad_lens, says in [
        (
            waves.astype(np.float64),
            lens,
            r"waves must be a float32 numpy array \[B, S\], got float64",
        ),
        (waves[0], lens, r"float32 \[2048\]"),
        (np.zeros((2, 3, n), np.float32), lens, r"got float32 \[2, 3, 2048\]"),
        (waves.tolist(), lens, "got list"),
        (waves, lens[:1], r"wave_lens must be a numpy array \[B=2\] .*got int32 \[1\]"),
        (waves, lens.astype(np.float32), "wave_lens must hold integers"),
        (waves, np.array([-1, n], np.int32), r"wave_lens -1\.\.2048 outside 0\.\.2048"),
        (waves, np.array([0, n + 1], np.int32), r"outside 0\.\.2048"),
    ]:
        with pytest.raises(MelInputError, match=says):
            mel_fn(bad_waves, bad_lens)
    mel, mel_lens = mel_fn(waves, lens.astype(np.int64))  # any integer lengths will do
    assert mel.shape == (2, 8, cfg.features.n_mels) and mel_lens.tolist() == [5, 8]
