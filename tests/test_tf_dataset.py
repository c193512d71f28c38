"""ring_dataset: a tf.data.Dataset over a real run's batch ring (stager + producers)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.shared.config import load_config
from tests.runs import Run, shm_segments, write_config

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
            "ring": {"slots": 8},
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
