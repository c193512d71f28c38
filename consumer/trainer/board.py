"""What the trainer writes to TensorBoard beside its step numbers.

The first things a multilingual team checks, every train.log_every steps:

- ``train/learning_rate``: the optimizer's rate at that step (a schedule evaluated);
- ``samples/language/<code>`` and ``samples/speaker/<name>``: samples trained on so far,
  counted from each batch's real rows (the names from the run's id tables,
  ``runs/<run-id>/ids.json``); the first MAX_SPEAKERS speakers seen get a tag each,
  the rest are summed under ``samples/speaker/(others)``, so a corpus of thousands of
  speakers does not write thousands of tags;
- ``stager/skipped/<stage>`` (positions skipped since the stager started) and
  ``stager/quarantined/<stage>`` (the run's quarantine file), ``stager/delivered``,
  and the shard cache (``stager/shard_cache/hits``, ``fetched``, ``bytes_fetched``,
  ``retries``, summed over the producers the stats list), from the stager's stats
  stream (a SUB socket; the last message wins).

Everything here is cheap per step: a bincount of at most a batch of ids.
"""

from __future__ import annotations

import collections
import logging
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from ringfeed.consumer.trainer.metrics import TensorBoardWriter
from ringfeed.shared.run.id_tables import IdTables, read_tables
from ringfeed.shared.run.stats_record import StagerStats
from ringfeed.shared.wire import protocol as p
from ringfeed.shared.wire.sockets import make_socket, recv

log = logging.getLogger(__name__)

# Speakers with a tag of their own; the rest are summed (see the module docstring).
MAX_SPEAKERS = 16
OTHERS = "(others)"


class RunBoard:
    """The trainer's TensorBoard writer, with the run's data and stager numbers."""

    def __init__(self, log_dir: Path, run_dir: Path, stats_endpoint: str) -> None:
        self.writer = TensorBoardWriter(str(log_dir))
        self.run_dir = run_dir
        self.tables: IdTables | None = None
        self.languages: collections.Counter[int] = collections.Counter()
        self.speakers: collections.Counter[int] = collections.Counter()
        self.ctx = zmq.Context()
        self.sub = make_socket(self.ctx, zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(stats_endpoint)
        self.stats: StagerStats | None = None

    def scalars(self, step: int, values: dict[str, Any], prefix: str = "") -> None:
        self.writer.scalars(step, values, prefix)

    def batch(self, speakers: np.ndarray | None, languages: np.ndarray | None) -> None:
        """One batch's real rows' speaker and language ids (None: the batch has none)."""
        for ids, counts in ((speakers, self.speakers), (languages, self.languages)):
            if ids is not None and ids.size:
                values, n = np.unique(ids, return_counts=True)
                counts.update(dict(zip(values.tolist(), n.tolist(), strict=True)))

    def report(self, step: int, learning_rate: float | None, fresh_s: float = 0.0) -> None:
        """Everything but the step numbers, at this step. fresh_s: wait up to that long
        for a stats message newer than any read (at the run's end: the stager's last
        numbers, not those of up to STATS_INTERVAL_S before)."""
        if fresh_s > 0:
            self._latest_stats()  # drop what waits, then wait for the next one
            self.sub.poll(fresh_s * 1000)
        values: dict[str, float] = {}
        if learning_rate is not None:
            values["train/learning_rate"] = learning_rate
        values |= self.data_scalars() | self.stager_scalars()
        self.writer.scalars(step, values)

    def data_scalars(self) -> dict[str, int]:
        tables = self._tables()
        if tables is None:
            return {}
        languages = self.languages.items()
        out = {f"samples/language/{_name(tables.languages, i)}": n for i, n in languages}
        seen = sorted(self.speakers)  # ids in the run's tables: the order names first appeared
        for i in seen[:MAX_SPEAKERS]:
            out[f"samples/speaker/{_name(tables.speakers, i) or '(none)'}"] = self.speakers[i]
        if len(seen) > MAX_SPEAKERS:
            out[f"samples/speaker/{OTHERS}"] = sum(self.speakers[i] for i in seen[MAX_SPEAKERS:])
        return out

    def stager_scalars(self) -> dict[str, int]:
        stats = self._latest_stats()
        if stats is None:
            return {}
        out = {"stager/delivered": stats.counters.get("delivered", 0)}
        out |= {f"stager/skipped/{k}": n for k, n in stats.skipped_by_stage.items()}
        out |= {f"stager/quarantined/{k}": n for k, n in stats.quarantined_by_stage.items()}
        out |= {f"stager/shard_cache/{k}": n for k, n in stats.shard_cache().items()}
        return out

    def close(self) -> None:
        self.writer.close()
        self.sub.close(linger=0)
        self.ctx.term()

    def _tables(self) -> IdTables | None:
        if self.tables is None:
            try:
                self.tables = read_tables(self.run_dir)
            except Exception as exc:  # the numbers are a view: never a reason to stop
                log.warning("no per-language numbers in TensorBoard: %s", exc)
        return self.tables

    def _latest_stats(self) -> StagerStats | None:
        """The last Stats message waiting (older ones are dropped unread)."""
        last = None
        while True:
            try:
                _, msg, _ = recv(self.sub)
            except zmq.Again:
                break
            except p.ProtocolError:
                continue
            if isinstance(msg, p.Stats):
                last = msg
        if last is not None:
            self.stats = StagerStats.from_dict(last.data)
        return self.stats


def _name(table: tuple[str, ...], i: int) -> str:
    return table[i] if 0 <= i < len(table) else f"id{i}"


def learning_rate(optimizer: Any, step: int) -> float | None:
    """The optimizer's learning rate at `step` (a schedule evaluated), or None."""
    rate = getattr(optimizer, "learning_rate", None)
    if rate is None:
        return None
    try:
        return float(rate(step) if callable(rate) else rate)
    except (TypeError, ValueError):
        return None
