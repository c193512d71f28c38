"""Checkpoint round trip: weights, optimizer state, step and cursor come back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from consumer.trainer.checkpoint import KEEP_LAST, CheckpointManager  # noqa: E402
from consumer.trainer.model import build_default_model, masked_l1  # noqa: E402
from consumer.trainer.train_step import TrainStep, make_optimizer  # noqa: E402
from shared.config import Config, replace  # noqa: E402

pytestmark = pytest.mark.usefixtures("tf_single_threaded")


def small_cfg() -> Config:
    return replace(
        Config(),
        stager={"batch_size": 4},
        features={"max_frames": 32},
        text={"max_text_len": 16},
        model={"kwargs": {"d_model": 16, "n_layers": 1}},
        train={"mixed_precision": False},
    )


def _batch(cfg: Config) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    batch = {k: rng.normal(size=s).astype(d) for k, (s, d) in cfg.batch_fields().items()}
    batch["tokens"] = rng.integers(0, cfg.vocab_size, batch["tokens"].shape).astype(np.int32)
    batch["text_lens"][:] = 10
    batch["mel_lens"][:] = 20
    return batch


def test_save_restore_round_trip(tmp_path: Path) -> None:
    cfg = small_cfg()
    model, optimizer = build_default_model(cfg, **cfg.model.kwargs), make_optimizer(cfg)
    manager = CheckpointManager(tmp_path, model, optimizer)
    assert manager.restore_latest() is None
    step = TrainStep(model, optimizer, masked_l1, jit_compile=False)
    for _ in range(3):
        step(_batch(cfg))
    cursor = {"epoch": 2, "batch_index": 7, "seed": 1234}
    manager.save(3, cursor, cfg.to_yaml())
    saved = [w.numpy().copy() for w in model.weights]
    saved_slots = [v.numpy().copy() for v in optimizer.variables]

    fresh_model, fresh_opt = build_default_model(cfg, **cfg.model.kwargs), make_optimizer(cfg)
    restored = CheckpointManager(tmp_path, fresh_model, fresh_opt).restore_latest()

    assert restored == (3, cursor)
    assert int(fresh_opt.iterations.numpy()) == 3
    for a, b in zip(saved, fresh_model.weights, strict=True):
        np.testing.assert_array_equal(a, b.numpy())
    for a, b in zip(saved_slots, fresh_opt.variables, strict=True):
        np.testing.assert_array_equal(a, b.numpy())
    assert manager.config_yaml(3) == cfg.to_yaml()


def test_keeps_last_three_with_their_sidecars(tmp_path: Path) -> None:
    cfg = small_cfg()
    model = build_default_model(cfg, **cfg.model.kwargs)
    manager = CheckpointManager(tmp_path, model, make_optimizer(cfg))
    for step in (10, 20, 30, 40, 50):
        manager.save(step, {"epoch": 0, "batch_index": step, "seed": 1}, "x: 1\n")
    assert [p.rsplit("-", 1)[1] for p in manager.checkpoints] == ["30", "40", "50"][-KEEP_LAST:]
    sidecars = sorted(p.name for p in manager.directory.glob("*.json"))
    assert sidecars == ["ckpt-30.json", "ckpt-40.json", "ckpt-50.json"]
    assert json.loads((manager.directory / "ckpt-50.json").read_text())["checkpoint"] == 50
    assert not list(manager.directory.glob(".*.tmp"))
