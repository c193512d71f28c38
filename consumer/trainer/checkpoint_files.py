"""Checkpoints whose weights a framework writes to one file: the PyTorch and JAX example
trainers' (consumer/trainer/torch_example/, consumer/trainer/jax_example/). No framework here.

Layout under ``<run_dir>/checkpoints/``, beside what the TensorFlow trainer's
checkpoints keep (consumer/trainer/checkpoint.py), with the same sidecar:

    ckpt-<step>.json          {"checkpoint", "step", "cursor", "config_yaml", "ids",
                               "prosody"}: sidecar(), as the TensorFlow trainer writes it
    ckpt-<step><suffix>       the weights and optimizer state (.pt, .npz)

The sidecar is written first (atomically), then the weights to a temporary file
renamed into place: a checkpoint is complete once its weights file exists, so a crash
mid-save leaves the previous one as the latest and at worst an orphan sidecar, which
the next save removes. The last KEEP_LAST are kept. A checkpoint that cannot be read
is passed over with a warning for the one before it, as the TensorFlow trainer's are.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringfeed.shared.memory.disk import DiskFull, is_full
from ringfeed.shared.run.id_tables import read_tables
from ringfeed.shared.run.process import write_json_atomic
from ringfeed.shared.run.prosody_table import read_run_table

log = logging.getLogger(__name__)

KEEP_LAST = 3
PREFIX = "ckpt"


def sidecar(run_dir: Path, step: int, cursor: dict[str, Any], config_yaml: str) -> dict:
    """What a checkpoint keeps beside its weights: the step, the data cursor, the
    resolved config, the run's speaker and language ids (the embedding rows mean these
    names: shared/run/id_tables.py) and the prosody statistics pitch was normalized with
    (inference inverts them: shared/run/prosody_table.py)."""
    record = {"checkpoint": step, "step": step, "cursor": cursor, "config_yaml": config_yaml}
    ids = read_tables(run_dir)
    if ids is not None:
        record["ids"] = ids.to_dict()
    prosody = read_run_table(run_dir)
    if prosody is not None:
        record["prosody"] = prosody
    return record


class FileCheckpoints:
    """Save and restore a model process's state: `save_weights(path)` writes the weights
    and optimizer state to path, `load_weights(path)` reads them back (raising when they
    do not fit the model). Called by the example trainers' loop (model_loop.py)."""

    def __init__(
        self,
        run_dir: Path,
        suffix: str,
        save_weights: Callable[[Path], None],
        load_weights: Callable[[Path], None],
    ) -> None:
        self.run_dir, self.suffix = Path(run_dir), suffix
        self.directory = self.run_dir / "checkpoints"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.save_weights, self.load_weights = save_weights, load_weights

    def save(self, step: int, cursor: dict[str, Any], config_yaml: str) -> str:
        """Write checkpoint `step`; returns its weights' path, or '' when the disk is
        full (one warning; training goes on and the next checkpoint tries again)."""
        weights = self._weights(step)
        tmp = weights.with_name(f".{weights.name}.tmp")
        try:
            write_json_atomic(self._sidecar(step), sidecar(self.run_dir, step, cursor, config_yaml))
            self.save_weights(tmp)
            os.replace(tmp, weights)
        except OSError as exc:
            if not is_full(exc):
                raise
            tmp.unlink(missing_ok=True)
            self._sidecar(step).unlink(missing_ok=True)
            log.warning(
                "checkpoint %d not saved: %s; training goes on and the next checkpoint"
                " tries again (train.checkpoint_every): free space there",
                step,
                DiskFull(self.directory),
            )
            return ""
        self._prune()
        log.info("saved checkpoint %s", weights)
        return str(weights)

    def restore_latest(self) -> tuple[int, dict[str, Any]] | None:
        """(step, cursor) of the newest readable checkpoint, its weights loaded; None if
        there is none; RuntimeError saying what to do when none of those kept can be read."""
        kept, failures = self.numbers(), []
        for number in reversed(kept):
            try:
                record = json.loads(self._sidecar(number).read_text())
                if record.get("checkpoint") != number:
                    raise ValueError(f"{self._sidecar(number)} is not checkpoint {number}'s")
                self.load_weights(self._weights(number))
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                failures.append(f"{PREFIX}-{number}: {type(exc).__name__}: {exc}")
                log.warning(
                    "checkpoint %d cannot be restored (%s: %s); trying the one before",
                    number,
                    type(exc).__name__,
                    exc,
                )
                continue
            log.info("restored checkpoint %d, cursor %s", number, record["cursor"])
            return int(record["step"]), record["cursor"]
        if not kept:
            return None
        raise RuntimeError(
            f"none of the {len(kept)} checkpoints in {self.directory} can be restored "
            f"({'; '.join(failures)}): put back a copy of that directory, or move it away to "
            "start this run from step 0"
        )

    def numbers(self) -> list[int]:
        """The complete checkpoints' numbers (their weights file exists), oldest first."""
        found = (
            p.name[len(PREFIX) + 1 : -len(self.suffix)]
            for p in self.directory.glob(f"{PREFIX}-*{self.suffix}")
        )
        return sorted(int(n) for n in found if n.isdigit())

    def _weights(self, number: int) -> Path:
        return self.directory / f"{PREFIX}-{number}{self.suffix}"

    def _sidecar(self, number: int) -> Path:
        return self.directory / f"{PREFIX}-{number}.json"

    def _prune(self) -> None:
        kept = self.numbers()
        for number in kept[:-KEEP_LAST]:
            self._weights(number).unlink(missing_ok=True)
        keep = set(kept[-KEEP_LAST:])
        for path in self.directory.glob(f"{PREFIX}-*.json"):
            number = path.stem[len(PREFIX) + 1 :]
            if number.isdigit() and int(number) not in keep:
                path.unlink(missing_ok=True)
