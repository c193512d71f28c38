"""The quarantine report: one JSON line per input that was not used, with its reason.

Written by the stager only (one writer per file); read by the run summary,
the inspector and tests. JSON lines so a crash loses at most the last line
and ``grep``/``jq`` work on a live run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any


class QuarantineWriter:
    """Appends ``{"item_id", "path", "reason", "stage", "time"}`` lines, line-buffered."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # buffering=1: each record reaches the file when written, so a reader sees it live.
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")
        self.count = 0

    def write(self, item_id: str, path: str, reason: str, stage: str) -> None:
        """stage: where it was rejected ("dataset", "text", "audio", "features", "lease")."""
        record = {"item_id": item_id, "path": path, "reason": reason, "stage": stage,
                  "time": time.time()}  # fmt: skip
        self._file.write(json.dumps(record) + "\n")
        self.count += 1

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> QuarantineWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.close()


def read_quarantine(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records of a quarantine file, in order; a torn last line (a crash) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # only a line cut short by a crash can be malformed
            continue
    return records
