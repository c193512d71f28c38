"""The compiled train step: one real step, traced once, and the step metrics."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from ringfeed.consumer.trainer.metrics import StepMetrics, format_line  # noqa: E402
from ringfeed.consumer.trainer.model import (  # noqa: E402
    DEFAULT_INPUTS,
    build_default_model,
    masked_l1,
)
from ringfeed.consumer.trainer.train_step import (  # noqa: E402
    TrainStep,
    batch_signature,
    make_optimizer,
    set_precision_policy,
)
from ringfeed.shared.config import Config, replace  # noqa: E402

pytestmark = pytest.mark.usefixtures("tf_single_threaded")


def small_cfg(jit_compile: bool = False) -> Config:
    return replace(
        Config(),
        stager={"batch_size": 4},
        features={"max_frames": 64},
        text={"max_text_len": 32},
        model={"kwargs": {"d_model": 16, "n_layers": 1}},
        train={"jit_compile": jit_compile},
    )


def random_batch(cfg: Config, seed: int) -> dict[str, np.ndarray]:
    """A batch exactly as cfg.batch_fields() says, with random lengths and contents."""
    rng = np.random.default_rng(seed)
    fields = cfg.batch_fields()
    b, t = fields["tokens"][0]
    f = cfg.features.max_frames
    return {
        "tokens": rng.integers(0, cfg.vocab_size, (b, t)).astype(np.int32),
        "text_lens": rng.integers(1, t + 1, b).astype(np.int32),
        "mel": rng.normal(-4.0, 2.0, fields["mel"][0]).astype(np.float32),
        "mel_lens": rng.integers(1, f + 1, b).astype(np.int32),
        "items": np.arange(b, dtype=np.int64),
        "speaker": rng.integers(0, cfg.data.max_speakers, b).astype(np.int32),
        "language": rng.integers(0, cfg.data.max_languages, b).astype(np.int32),
    }


@pytest.mark.parametrize("jit_compile", [False, True])
def test_train_step_traces_once(jit_compile: bool) -> None:
    cfg = small_cfg(jit_compile)
    # No GPU here: mixed_precision (on by default) must fall back to float32.
    assert set_precision_policy(cfg) == (
        "mixed_float16" if tf.config.list_physical_devices("GPU") else "float32"
    )
    model = build_default_model(cfg, **cfg.model.kwargs)
    optimizer = make_optimizer(cfg)
    step = TrainStep(model, optimizer, masked_l1, jit_compile=cfg.train.jit_compile)
    # The default model's inputs, all of them batch fields a model may take.
    assert step.signature.keys() == set(DEFAULT_INPUTS) <= batch_signature(cfg).keys()
    before = [w.numpy().copy() for w in model.trainable_weights]

    loss = step(random_batch(cfg, 0))
    assert loss.dtype == tf.float32 and loss.shape == () and np.isfinite(float(loss))
    assert any(
        not np.array_equal(a, w.numpy())
        for a, w in zip(before, model.trainable_weights, strict=True)
    )
    for seed in range(1, 4):  # different contents and lengths, same shapes
        step(random_batch(cfg, seed))
    assert step.trace_count == 1
    assert int(optimizer.iterations.numpy()) == 4


def bucket_batch(cfg: Config, rows: int, frames: int, text: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "tokens": rng.integers(0, cfg.vocab_size, (rows, text)).astype(np.int32),
        "text_lens": rng.integers(1, text + 1, rows).astype(np.int32),
        "mel": rng.normal(-4.0, 2.0, (rows, frames, cfg.features.n_mels)).astype(np.float32),
        "mel_lens": rng.integers(1, frames + 1, rows).astype(np.int32),
        "speaker": rng.integers(0, cfg.data.max_speakers, rows).astype(np.int32),
        "language": rng.integers(0, cfg.data.max_languages, rows).astype(np.int32),
    }


@pytest.mark.parametrize("jit_compile", [False, True])
def test_with_buckets_the_step_compiles_once_per_bucket(jit_compile: bool) -> None:
    # Two buckets: each XLA compile of the step costs seconds on 2 cores.
    cfg = replace(small_cfg(jit_compile), stager={"batch_size": 4, "buckets": [32, 64]})
    set_precision_policy(cfg)
    model = build_default_model(cfg, **cfg.model.kwargs)
    step = TrainStep(model, make_optimizer(cfg), masked_l1, jit_compile, max_shapes=2)
    shapes = [(8, 32, 16), (4, 64, 32)]  # rows x frames = the same budget
    for seed in range(3):
        for rows, frames, text in shapes:
            loss = step(bucket_batch(cfg, rows, frames, text, seed))
            assert np.isfinite(float(loss))
    assert step.trace_count == len(shapes)
    with pytest.raises(ValueError, match="more than the 2 length buckets"):
        step(bucket_batch(cfg, 2, 48, 8, 0))


def test_train_step_rejects_wrong_shapes() -> None:
    cfg = small_cfg()
    model = build_default_model(cfg, **cfg.model.kwargs)
    step = TrainStep(model, make_optimizer(cfg), masked_l1, jit_compile=False)
    bigger = random_batch(replace(cfg, stager={"batch_size": 8}), 0)
    with pytest.raises((TypeError, ValueError)):
        step(bigger)
    assert step.trace_count == 0


def test_step_metrics_window() -> None:
    metrics = StepMetrics(window=4)
    for step_s in [1.0, 1.0, 1.0, 3.0, 1.0]:  # the first falls out of the window
        metrics.record(step_time_s=step_s, wait_s=0.5, batch_size=8)
    s = metrics.summary()
    assert s["steps"] == 5
    assert s["step_time_s"] == pytest.approx(1.5)
    assert s["wait_s"] == pytest.approx(0.5)
    assert s["wait_frac"] == pytest.approx(2.0 / 8.0)
    assert s["samples_per_s"] == pytest.approx(32 / 8.0)
    assert s["step_time_cv"] == pytest.approx(np.std([1, 1, 3, 1]) / 1.5)
    line = format_line(10, 0.25, s)
    assert "step 10" in line and "wait" in line
    assert StepMetrics(window=3).summary()["steps"] == 0


def test_cpu_trainer_threads_default_to_every_core() -> None:
    from ringfeed.consumer.trainer.trainer import cpu_threads
    from ringfeed.shared.config import Config, replace

    assert cpu_threads(Config(), 16) == 16  # producers.workers no longer takes cores away
    assert cpu_threads(replace(Config(), train={"cpu_threads": 3}), 16) == 3


def test_the_default_model_takes_the_fields_it_knows_and_ignores_the_rest() -> None:
    """A batch with a reference clip, pitch and energy trains the default model, which
    reads tokens, mel, their lengths and the ids only."""
    from ringfeed.consumer.trainer.model import DEFAULT_INPUTS

    cfg = replace(
        small_cfg(),
        features={"pitch": True, "energy": True, "reference": True, "reference_frames": 16},
    )
    model = build_default_model(cfg, **cfg.model.kwargs)
    assert sorted(t.name for t in model.inputs) == sorted(DEFAULT_INPUTS)
    step = TrainStep(model, make_optimizer(cfg), masked_l1, jit_compile=False)
    known = random_batch(cfg, 0)
    batch = {k: known.get(k, np.zeros(s, d)) for k, (s, d) in cfg.batch_fields().items()}
    assert {"ref_mel", "ref_mel_lens", "pitch", "voiced", "energy"} <= batch.keys()
    assert np.isfinite(float(step(batch)))
