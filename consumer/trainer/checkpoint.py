"""Checkpoints of the trainer: weights, optimizer state, step, data cursor, config.

Layout under ``<run_dir>/checkpoints/`` (tf.train.CheckpointManager, last 3 kept):

    ckpt-<step>.index, ckpt-<step>.data-*   model, optimizer (slots, iterations), step
    ckpt-<step>.json                        {"checkpoint": <step>, "step", "cursor",
                                             "config_yaml", "ids": the run's id tables,
                                             "prosody": the pitch_norm statistics, if any}
    checkpoint                              TF's pointer to the latest

The cursor (position, epoch, batch_index, seed; plan: the plan fingerprint that a
resume must find again, shared/run/fingerprint.py) lets the stager resume its plan in O(1)
(docs/design.md#contract-4). The sidecar JSON is written first, via a temp
file, fsync and os.replace (shared.run.process.write_json_atomic), so it is never
half-written, even after a power loss; TF updates its ``checkpoint`` pointer
last, so a crash mid-save leaves the previous checkpoint as the latest and at
worst an orphan sidecar, which the next save removes.

A kept checkpoint that cannot be read (corrupt TF files, a missing or unreadable
sidecar) is passed over on restore with a warning naming it, for the one kept
before it: a corrupt latest checkpoint used to end the trainer at set-up with
two good ones beside it (issue 18, case 12).

A save on a full disk is one warning naming the folder and its free space
(shared/memory/disk.py), and training goes on: the next checkpoint tries again, and
the kept ones stay as they were (a half-written one is never the latest, above).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from ringfeed.consumer.trainer.checkpoint_files import KEEP_LAST, PREFIX, sidecar
from ringfeed.shared.config import Config
from ringfeed.shared.config.environment import run_dir
from ringfeed.shared.memory.disk import DiskFull, is_full
from ringfeed.shared.run.process import write_json_atomic
from ringfeed.shared.run.share import Share

log = logging.getLogger(__name__)

# What reading one damaged checkpoint raises (TF: DataLossError and kin are OpErrors, a
# cut-short .data file is an IndexError; the sidecar: OSError, ValueError for bad JSON).
# Not AssertionError: a model that no longer matches is no damage, an older one won't fit.
UNREADABLE = (tf.errors.OpError, OSError, ValueError, KeyError, IndexError)


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
        """Write checkpoint number `step` with its cursor and resolved config; returns its
        path, or '' when its disk is full (said in one line; training goes on).

        cursor: {"position", "epoch", "batch_index", "seed", "plan"} of the next batch.
        """
        try:
            return self._save(step, cursor, config_yaml)
        except (OSError, tf.errors.OpError) as exc:
            if not (is_full(exc) or _tf_full(exc)):
                raise
            # What this save left (TF's temp folder, its sidecar) would hold space for nothing.
            shutil.rmtree(self.directory / f"{PREFIX}-{step}_temp", ignore_errors=True)
            self._sidecar(step).unlink(missing_ok=True)
            log.warning(
                "checkpoint %d not saved: %s; training goes on and the next checkpoint"
                " tries again (train.checkpoint_every): free space there",
                step,
                DiskFull(self.directory),
            )
            return ""

    def _save(self, step: int, cursor: dict[str, Any], config_yaml: str) -> str:
        # The same sidecar as the PyTorch and JAX trainers' (checkpoint_files.py).
        record = sidecar(self.directory.parent, step, cursor, config_yaml)
        write_json_atomic(self._sidecar(step), record)
        self._step.assign(step)
        path = self._manager.save(checkpoint_number=step)
        self._remove_stale_sidecars()
        log.info("saved checkpoint %s", path)
        return path

    def restore_latest(self) -> tuple[int, dict[str, Any]] | None:
        """Restore the newest kept checkpoint that can be read into model and optimizer:
        (step, cursor), or None if there is none. One that cannot be read is passed over
        with a warning naming it; RuntimeError, saying what to do, if none can be."""
        candidates, failures = self._candidates(), []
        for path in candidates:
            try:
                restored = self._restore(path)
            except UNREADABLE as exc:
                failures.append(f"{Path(path).name}: {type(exc).__name__}: {exc}")
                log.warning(
                    "checkpoint %s cannot be restored (%s: %s); trying the one before",
                    path,
                    type(exc).__name__,
                    exc,
                )
                continue
            if failures:
                log.warning(
                    "resumed from %s: newer checkpoints unreadable (%s)", path, "; ".join(failures)
                )
            return restored
        if not candidates:
            return None
        raise RuntimeError(
            f"none of the {len(candidates)} checkpoints in {self.directory} can be restored "
            f"({'; '.join(failures)}): put back a copy of that directory, or move it away to "
            "start this run from step 0"
        )

    def _restore(self, path: str) -> tuple[int, dict[str, Any]]:
        """Restore checkpoint `path` (sidecar first: a bad one leaves the model untouched)."""
        number = _number(path)
        sidecar_path = self._sidecar(number)
        try:
            sidecar = json.loads(sidecar_path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path} has no {sidecar_path.name} (cursor and config): the run directory "
                "was copied incompletely; copy the .json files too or start a new run"
            ) from None
        if not isinstance(sidecar, dict) or sidecar.get("checkpoint") != number:
            raise ValueError(f"{sidecar_path} is not the sidecar of checkpoint {number}")
        cursor = sidecar["cursor"]
        # Fails loudly if the model or optimizer no longer match what was saved.
        self._checkpoint.restore(path).assert_existing_objects_matched()
        step = int(self._step.numpy())
        log.info("restored %s at step %d, cursor %s", path, step, cursor)
        return step, cursor

    def _candidates(self) -> list[str]:
        """Kept checkpoints, newest first: TF's list, or the ones on disk where its pointer
        file is gone or unreadable (a fresh start would overwrite them)."""
        listed = list(reversed(self._manager.checkpoints))
        if listed:
            return listed
        indexes = self.directory.glob(f"{PREFIX}-*.index")
        on_disk = sorted((str(p.with_suffix("")) for p in indexes), key=_number, reverse=True)
        if on_disk:
            log.warning(
                "%s names no checkpoint, %d are on disk: trying them newest first",
                self.directory / "checkpoint",
                len(on_disk),
            )
        return on_disk

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


def _tf_full(exc: BaseException) -> bool:
    """Is exc TensorFlow's word for a full disk? (Its file system raises OpErrors that
    carry the OS's message, not an errno.)"""
    text = str(exc)
    return isinstance(exc, tf.errors.OpError) and ("No space left" in text or "quota" in text)


def _number(path: str) -> int:
    """The checkpoint number in '.../ckpt-<n>'."""
    return int(Path(path).name.rsplit("-", 1)[1])


def chief_dir(cfg: Config, share: Share, run_id: str) -> Path:
    """The run directory whose checkpoints this worker resumes: the chief's, or, when it
    has none and the chief's of the other layout has (base for one worker, base-w0 for
    several), that one: the run resumed with another number of workers, which
    continues the same global plan at the same global position (shared/run/share.py)."""
    ours, other = (run_dir(cfg, r) for r in share.chief_run_ids(run_id))
    if has_checkpoint(ours) or not has_checkpoint(other):
        return ours
    log.info("resuming %s from %s: the run had another number of workers", ours, other)
    return other


def has_checkpoint(directory: Path) -> bool:
    return any((directory / "checkpoints").glob(f"{PREFIX}-*.index"))
