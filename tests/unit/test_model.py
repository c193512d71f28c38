"""The default model: shapes, masking, causality, the factory hook, and that it learns."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from ringfeed.consumer.trainer.model import (  # noqa: E402
    DEFAULT_INPUTS,
    build_default_model,
    load_model_factory,
    masked_l1,
)
from ringfeed.consumer.trainer.train_step import TrainStep, make_optimizer  # noqa: E402
from ringfeed.shared.config import Config, ConfigError, replace  # noqa: E402
from ringfeed.shared.sample.content import LOG_FLOOR  # noqa: E402
from tests.support.paths import MINI  # noqa: E402

pytestmark = pytest.mark.usefixtures("tf_single_threaded")


def small_cfg(**model: object) -> Config:
    return replace(
        Config(),
        stager={"batch_size": 4},
        features={"max_frames": 64},
        text={"max_text_len": 32},
        model={"kwargs": {"d_model": 32, "n_layers": 2, "dropout": 0.0, **model}},
        train={"learning_rate": 3e-3, "mixed_precision": False},
    )


def model_inputs_of(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The fields the default model takes (a batch has more: items, position, valid...)."""
    return {k: batch[k] for k in DEFAULT_INPUTS}


def _real_batch(cfg: Config) -> dict[str, np.ndarray] | None:
    """Log-mels of the first two LJSpeech clips, cut to max_frames, each used twice."""
    import librosa

    meta = MINI / "metadata.csv"
    if not meta.is_file():
        return None
    rows = [line.split("|") for line in meta.read_text().splitlines()[:2]]
    f, t = cfg.features, cfg.text
    batch = {k: np.zeros(s, d) for k, (s, d) in cfg.batch_fields().items()}
    for i in range(cfg.stager.batch_size):
        clip_id, text = rows[i % 2][0], rows[i % 2][-1].lower()
        y, _ = librosa.load(MINI / "wavs" / f"{clip_id}.wav", sr=cfg.audio.sample_rate)
        n_frames = f.max_frames - 8 * (i // 2)  # two lengths per clip: padding must be masked
        y = y[: (n_frames - 1) * f.hop_length]
        mel = librosa.feature.melspectrogram(
            y=y,
            sr=cfg.audio.sample_rate,
            n_fft=f.n_fft,
            hop_length=f.hop_length,
            n_mels=f.n_mels,
            fmax=f.fmax,
            power=1.0,
            pad_mode="constant",
        )
        ids = [3 + t.alphabet.index(c) if c in t.alphabet else 1 for c in text][: t.max_text_len]
        batch["mel"][i, :n_frames] = np.log(np.maximum(mel.T, LOG_FLOOR))
        batch["mel_lens"][i], batch["text_lens"][i] = n_frames, len(ids)
        batch["tokens"][i, : len(ids)] = ids
    return batch


def structured_batch(cfg: Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Real clips when data/ljspeech-mini is there, else a smooth mel that depends on the text."""
    real = _real_batch(cfg) if seed == 0 else None
    if real is not None:
        return real
    rng = np.random.default_rng(seed)
    b, t = cfg.stager.batch_size, cfg.text.max_text_len
    f, m = cfg.features.max_frames, cfg.features.n_mels
    batch = {k: np.zeros(s, d) for k, (s, d) in cfg.batch_fields().items()}
    batch["text_lens"][:] = rng.integers(t // 2, t + 1, b)
    batch["mel_lens"][:] = rng.integers(f // 2, f + 1, b)
    for i in range(b):
        batch["tokens"][i, : batch["text_lens"][i]] = rng.integers(3, cfg.vocab_size, t)[
            : batch["text_lens"][i]
        ]
        tok = batch["tokens"][i, (np.arange(f) * batch["text_lens"][i]) // f]
        bins = np.arange(m)[None, :]
        batch["mel"][i] = -6 + 4 * np.exp(-((bins - 2 * tok[:, None]) ** 2) / 50.0)
    batch["items"][:] = np.arange(b)
    return batch


def test_default_model_shapes_and_size() -> None:
    cfg = small_cfg()
    model = build_default_model(cfg, **cfg.model.kwargs)
    batch = structured_batch(cfg)
    out = model(model_inputs_of(batch))
    assert out.shape == (4, 64, cfg.features.n_mels) and out.dtype == tf.float32
    # At the defaults (d_model 128, 3 layers) the model is small but real: 1-3 M params.
    assert 1_000_000 <= build_default_model(Config()).count_params() <= 3_000_000


def test_decoder_is_causal_and_ignores_padding() -> None:
    cfg = small_cfg()
    model = build_default_model(cfg, **cfg.model.kwargs)
    batch = {k: v for k, v in structured_batch(cfg, seed=1).items() if k != "items"}
    base = model(model_inputs_of(batch)).numpy()
    changed = dict(batch, mel=batch["mel"].copy())
    changed["mel"][:, 40:] += 3.0  # frame 40 onwards: predictions up to frame 40 must not move
    assert np.allclose(model(model_inputs_of(changed)).numpy()[:, :41], base[:, :41], atol=1e-5)
    padded = dict(batch, tokens=batch["tokens"].copy())
    for i, n in enumerate(batch["text_lens"]):
        padded["tokens"][i, n:] = 7  # garbage beyond text_lens must not matter
    assert np.allclose(model(model_inputs_of(padded)).numpy(), base, atol=1e-5)


def test_masked_l1_counts_true_frames_only() -> None:
    target = np.zeros((2, 5, 3), np.float32)
    pred = np.ones((2, 5, 3), np.float32)
    pred[:, 3:] = 100.0  # beyond the true length: must not count
    loss = masked_l1(pred, target, np.array([3, 3], np.int32))
    assert float(loss) == pytest.approx(1.0)


def test_factory_hook_accepts_model_or_model_and_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("user_tts")

    def custom_loss(pred, target, mel_lens):
        return masked_l1(pred, target, mel_lens) * 2.0

    module.plain = build_default_model
    module.with_loss = lambda cfg, **kwargs: (build_default_model(cfg, **kwargs), custom_loss)
    monkeypatch.setitem(sys.modules, "user_tts", module)
    _, loss_fn = load_model_factory(replace(small_cfg(), model={"factory": "user_tts:plain"}))
    assert loss_fn is masked_l1
    _, loss_fn = load_model_factory(replace(small_cfg(), model={"factory": "user_tts:with_loss"}))
    assert loss_fn is custom_loss
    with pytest.raises(ValueError, match="no function"):
        load_model_factory(replace(small_cfg(), model={"factory": "user_tts:missing"}))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"d_modle": 64}, "model.kwargs.d_modle: unknown key; did you mean 'd_model'?"),
        ({"n_layers": 0}, "model.kwargs.n_layers: must be >= 1, got 0"),
        ({"kernel_size": 2.5}, "model.kwargs.kernel_size: must be an integer"),
        ({"dropout": 1.0}, "model.kwargs.dropout: must be in [0, 1)"),
    ],
)
def test_the_default_model_checks_its_kwargs_by_name(kwargs: dict, needle: str) -> None:
    cfg = replace(small_cfg(), model={"kwargs": kwargs})
    with pytest.raises(ConfigError) as info:
        load_model_factory(cfg)
    assert str(info.value).startswith(needle)


def test_kwargs_a_factory_does_not_take_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("user_tts")
    module.cfg_only = lambda cfg: build_default_model(cfg)
    monkeypatch.setitem(sys.modules, "user_tts", module)
    cfg = replace(small_cfg(), model={"factory": "user_tts:cfg_only"})  # kwargs d_model, ...
    with pytest.raises(ConfigError, match=r"model\.kwargs: user_tts:cfg_only does not take"):
        load_model_factory(cfg)


def test_loss_drops_over_30_steps() -> None:
    cfg = small_cfg()
    keras.utils.set_random_seed(0)
    model, loss_fn = load_model_factory(cfg)
    step = TrainStep(model, make_optimizer(cfg), loss_fn, jit_compile=False)
    batch = structured_batch(cfg)
    losses = [float(step(batch)) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert step.trace_count == 1
