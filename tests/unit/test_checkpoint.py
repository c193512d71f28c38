"""Checkpoint round trip: weights, optimizer state, step and cursor come back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from ringfeed.consumer.trainer.checkpoint import KEEP_LAST, CheckpointManager  # noqa: E402
from ringfeed.consumer.trainer.model import build_default_model, masked_l1  # noqa: E402
from ringfeed.consumer.trainer.train_step import TrainStep, make_optimizer  # noqa: E402
from ringfeed.shared.config import Config, replace  # noqa: E402

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


def _cursor(step: int) -> dict[str, int]:
    return {"epoch": 0, "batch_index": step, "seed": 1}


def _three_trained_checkpoints(tmp_path: Path, cfg: Config) -> dict[int, list[np.ndarray]]:
    """Checkpoints 10, 20, 30, one train step apart; -> the weights saved in each."""
    model, optimizer = build_default_model(cfg, **cfg.model.kwargs), make_optimizer(cfg)
    manager = CheckpointManager(tmp_path, model, optimizer)
    step, saved = TrainStep(model, optimizer, masked_l1, jit_compile=False), {}
    for number in (10, 20, 30):
        step(_batch(cfg))
        manager.save(number, _cursor(number), cfg.to_yaml())
        saved[number] = [w.numpy().copy() for w in model.weights]
    return saved


def _restore_fresh(tmp_path: Path, cfg: Config) -> tuple[object, keras.Model]:
    """What a resumed trainer does: a new model, then restore_latest."""
    model = build_default_model(cfg, **cfg.model.kwargs)
    return CheckpointManager(tmp_path, model, make_optimizer(cfg)).restore_latest(), model


def _flip_bytes(path: Path) -> None:
    path.write_bytes(bytes(b ^ 0xFF for b in path.read_bytes()))


DAMAGE = {
    "data flipped": lambda d: _flip_bytes(next(d.glob("ckpt-30.data-*"))),
    "data cut short": lambda d: [
        p.write_bytes(p.read_bytes()[:100]) for p in d.glob("ckpt-30.data-*")
    ],
    "index garbage": lambda d: (d / "ckpt-30.index").write_bytes(b"garbage"),
    "sidecar cut short": lambda d: (d / "ckpt-30.json").write_text('{"checkpoint": 30, "st'),
    "sidecar missing": lambda d: (d / "ckpt-30.json").unlink(),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_an_unreadable_latest_checkpoint_falls_back_to_the_one_before(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = small_cfg()
    saved = _three_trained_checkpoints(tmp_path, cfg)
    DAMAGE[damage](tmp_path / "checkpoints")
    with caplog.at_level("WARNING", logger="ringfeed.consumer.trainer.checkpoint"):
        restored, model = _restore_fresh(tmp_path, cfg)
    assert restored == (20, _cursor(20))
    for a, b in zip(saved[20], model.weights, strict=True):
        np.testing.assert_array_equal(a, b.numpy())
    assert any("ckpt-30" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


def test_no_readable_checkpoint_is_an_error_that_says_what_to_do(tmp_path: Path) -> None:
    cfg = small_cfg()
    _three_trained_checkpoints(tmp_path, cfg)
    for path in (tmp_path / "checkpoints").glob("ckpt-*.index"):
        path.write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match="none of the 3 checkpoints .* move it away"):
        _restore_fresh(tmp_path, cfg)


def test_an_unreadable_pointer_file_does_not_start_the_run_over(tmp_path: Path) -> None:
    """TF reads a garbled ``checkpoint`` file as "no checkpoint": the ones on disk count."""
    cfg = small_cfg()
    saved = _three_trained_checkpoints(tmp_path, cfg)
    (tmp_path / "checkpoints" / "checkpoint").write_text("garbage {{{")
    restored, model = _restore_fresh(tmp_path, cfg)
    assert restored == (30, _cursor(30))
    np.testing.assert_array_equal(saved[30][0], model.weights[0].numpy())


def test_a_checkpoint_on_a_full_disk_is_one_line_and_the_next_one_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """ENOSPC at the sidecar (the OS's errno) and at TF's own write (an OpError that
    carries the OS's message): neither ends training; the next save goes through."""
    from ringfeed.consumer.trainer import checkpoint
    from tests.support.full_disk import no_space

    cfg = small_cfg()
    manager = CheckpointManager(
        tmp_path, build_default_model(cfg, **cfg.model.kwargs), make_optimizer(cfg)
    )
    with monkeypatch.context() as patch, caplog.at_level("WARNING"):
        patch.setattr(checkpoint, "write_json_atomic", no_space)
        assert manager.save(10, _cursor(10), "x: 1\n") == ""
        patch.undo()
        full = tf.errors.ResourceExhaustedError(None, None, "ckpt-20_temp: No space left on device")
        patch.setattr(manager._manager, "save", lambda **_: (_ for _ in ()).throw(full))
        assert manager.save(20, _cursor(20), "x: 1\n") == ""
    lines = [r.getMessage() for r in caplog.records if "not saved" in r.getMessage()]
    assert [line.split(":")[0] for line in lines] == [
        "checkpoint 10 not saved",
        "checkpoint 20 not saved",
    ]
    assert all(f"no space left on the disk holding {manager.directory} (" in x for x in lines)
    assert not list(manager.directory.glob("ckpt-*.json"))  # nothing left holding space
    assert manager.save(30, _cursor(30), "x: 1\n").endswith("ckpt-30")
