"""ring_dataset: a tf.data.Dataset over a real run's batch ring (stager + producers)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.shared.config import load_config
from tests.support.configs import write_config
from tests.support.processes import CLI
from tests.support.runs import Run, shm_segments

tf = pytest.importorskip("tensorflow")

from ringfeed.consumer.client.tf_dataset import ring_dataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("tf_single_threaded")


@pytest.mark.slow
def test_ring_dataset_yields_static_batches_until_the_plan_ends(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        {
            "data": {"format": "synthetic", "synthetic_items": 24},
            "features": {"max_frames": 32, "cache": False},
            "text": {"max_text_len": 32},
            "stager": {"batch_size": 4, "epochs": 1},
            "producers": {"workers": 1},
        },
    )
    cfg = load_config(config)
    with Run(config, f"tds-{uuid.uuid4().hex[:6]}", tmp_path) as run:
        run.start("stager")
        run.start("producers")
        ds = ring_dataset(cfg, run.run_id)
        for name, (shape, dtype) in cfg.batch_fields().items():
            assert ds.element_spec[name].shape == shape
            assert ds.element_spec[name].dtype == tf.as_dtype(dtype)
        batches = list(ds.as_numpy_iterator())
        # End of a 1-epoch plan: the dataset ends and its BYE stops the run.
        assert run.wait_all(timeout_s=30) == {"stager": 0, "producers": 0}, run.logs()
        assert shm_segments(run.run_id) == []
    assert len(batches) == 24 // 4
    # Copies, not views of a reused slot: every row of each batch holds its own item.
    items = sorted(i for b in batches for i in check_synthetic_rows(b, 4, cfg))
    assert items == list(range(24)), "each item exactly once in the epoch"


@pytest.mark.slow
def test_the_data_side_alone_feeds_a_keras_fit_and_ends_with_it(tmp_path: Path) -> None:
    """`ringfeed run CONFIG --consumer none`: stager and producers only; the user's own
    Keras model.fit over ring_dataset is the consumer, and the end of its plan (one
    epoch here) ends the run: the launcher exits 0, nothing left in /dev/shm."""
    import subprocess

    import numpy as np

    from tests.support.paths import REPO

    n, rows = 24, 4
    config = write_config(
        tmp_path,
        {
            "data": {"format": "synthetic", "synthetic_items": n},
            "features": {"max_frames": 32, "cache": False},
            "text": {"max_text_len": 32},
            "stager": {"batch_size": rows, "epochs": 1},
            "producers": {"workers": 1},
        },
    )
    cfg, run_id = load_config(config), f"none-{uuid.uuid4().hex[:6]}"
    launcher = subprocess.Popen(
        [*CLI, "run", str(config), "--consumer", "none", "--run-id", run_id],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[int] = []

    names = list(cfg.batch_fields())

    def checked(*arrays: np.ndarray) -> np.ndarray:
        batch = dict(zip(names, arrays, strict=True))
        seen.extend(check_synthetic_rows(batch, rows, cfg))
        return batch["mel"]

    def to_xy(batch: dict) -> tuple:
        mel = tf.numpy_function(checked, [batch[name] for name in names], tf.float32)
        mel = tf.ensure_shape(mel, batch["mel"].shape)
        return mel, tf.zeros([rows, 1])

    try:
        model = tf.keras.Sequential(
            [
                tf.keras.Input(cfg.batch_fields()["mel"][0][1:]),
                tf.keras.layers.GlobalAveragePooling1D(),
                tf.keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="sgd", loss="mse")
        history = model.fit(ring_dataset(cfg, run_id).map(to_xy), epochs=1, verbose=0)
        out, _ = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, out
    assert "the data side only" in out and len(history.history["loss"]) == 1
    assert sorted(seen) == list(range(n)), "each item exactly once, every row checked"
    assert shm_segments(run_id) == []
