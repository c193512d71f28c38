"""Checkpoints of the trainer: weights, optimizer state, step, data cursor, config.

Layout under ``<run_dir>/checkpoints/`` (tf.train.CheckpointManager, last 3 kept):

    ckpt-<step>.index, ckpt-<step>.data-*   model, optimizer (slots, iterations), step
    ckpt-<step>.json                        {"checkpoint": <step>, "step", "cursor",
                                             "config_yaml"}
    checkpoint                              TF's pointer to the latest

The cursor (position, epoch, batch_index, seed; plan: the plan fingerprint that a
resume must find again, shared/fingerprint.py) lets the stager resume its plan in O(1)
(README, "Design", contract 4). The sidecar JSON is written first, via a temp
file and os.replace, so it is never half-written; TF updates its ``checkpoint``
pointer last, so a crash mid-save leaves the previous checkpoint as the latest
and at worst an orphan sidecar, which the next save removes.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

log = logging.getLogger(__name__)

KEEP_LAST = 3
PREFIX = "ckpt"


class CheckpointManager:
    """Save and restore the trainer's state; called by the trainer process.

    Builds the optimizer on the model's variables if needed, so its slots exist
    before a restore (Keras 3 variables are not restored lazily).
    """

    def __init__(
        self, run_dir: str | os.PathLike[str], model: keras.Model, optimizer: keras.Optimizer
    ) -> None:
        self.directory = Path(run_dir) / "checkpoints"
        self.directory.mkdir(parents=True, exist_ok=True)
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=self._step)
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, str(self.directory), max_to_keep=KEEP_LAST, checkpoint_name=PREFIX
        )

    def save(self, step: int, cursor: dict[str, Any], config_yaml: str) -> str:
        """Write checkpoint number `step` with its cursor and resolved config; returns its path.

        cursor: {"position", "epoch", "batch_index", "seed", "plan"} of the next batch.
        """
        sidecar = {"checkpoint": step, "step": step, "cursor": cursor, "config_yaml": config_yaml}
        _write_json_atomic(self._sidecar(step), sidecar)
        self._step.assign(step)
        path = self._manager.save(checkpoint_number=step)
        self._remove_stale_sidecars()
        log.info("saved checkpoint %s", path)
        return path

    def restore_latest(self) -> tuple[int, dict[str, Any]] | None:
        """Restore the newest checkpoint into model and optimizer; (step, cursor) or None."""
        path = self._manager.latest_checkpoint
        if path is None:
            return None
        number = _number(path)
        sidecar_path = self._sidecar(number)
        try:
            sidecar = json.loads(sidecar_path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path} has no {sidecar_path.name} (cursor and config): the run directory "
                "was copied incompletely; copy the .json files too or start a new run"
            ) from None
        if sidecar.get("checkpoint") != number:
            raise ValueError(f"{sidecar_path} names checkpoint {sidecar.get('checkpoint')}")
        # Fails loudly if the model or optimizer no longer match what was saved.
        self._checkpoint.restore(path).assert_existing_objects_matched()
        step = int(self._step.numpy())
        log.info("restored %s at step %d, cursor %s", path, step, sidecar["cursor"])
        return step, sidecar["cursor"]

    def config_yaml(self, step: int) -> str:
        """The resolved config saved with checkpoint `step`."""
        return json.loads(self._sidecar(step).read_text())["config_yaml"]

    @property
    def checkpoints(self) -> list[str]:
        """Paths of the kept checkpoints, oldest first."""
        return list(self._manager.checkpoints)

    def _sidecar(self, number: int) -> Path:
        return self.directory / f"{PREFIX}-{number}.json"

    def _remove_stale_sidecars(self) -> None:
        kept = {_number(p) for p in self._manager.checkpoints}
        for path in self.directory.glob(f"{PREFIX}-*.json"):
            if _number(str(path.with_suffix(""))) not in kept:
                path.unlink(missing_ok=True)


def _number(path: str) -> int:
    """The checkpoint number in '.../ckpt-<n>'."""
    return int(Path(path).name.rsplit("-", 1)[1])


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    # os.replace is atomic on POSIX: readers see the old file or the whole new one.
    os.replace(tmp, path)
