"""The quarantine report: one JSON line per input that was not used, with its reason.

Written by the stager only (one writer per file); read by the run summary,
the inspector and tests. JSON lines so a crash loses at most the last line
and ``grep``/``jq`` work on a live run. An item's line decides what a resumed
run skips, so it is fsynced when written (lines are rare: one per bad input);
a bad metadata line is found again at every start and is only flushed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from ringfeed.shared.corpus.index import CorpusIndex

# The stage of a clip data.outliers skips: out of its speaking-rate band (the stager, at
# start) or near-silent or clipped (the producer that decoded it).
OUTLIER_STAGE = "outlier"


class QuarantineWriter:
    """Appends ``{"item_id", "path", "reason", "stage", "time"}`` lines, line-buffered.

    One line per input per run: a record already in the file (a stager restarted
    into the same run directory) is not written again. An item's key is its id;
    a bad metadata line's (stage "metadata") is its file:line."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.earlier = read_quarantine(self.path)
        self._seen = {_key(r["item_id"], r["path"], r["stage"]) for r in self.earlier}
        new = not self.path.exists()
        # buffering=1: each record reaches the file when written, so a reader sees it live.
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")
        if new:  # the file's name lives in the directory: make it survive a power loss too
            fd = os.open(self.path.parent, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        if _ends_torn(self.path):  # a crash cut the last line: the next one starts fresh
            self._file.write("\n")
        self.count = 0

    def write(self, item_id: str, path: str, reason: str, stage: str) -> bool:
        """stage: where it was rejected ("metadata", "text", "audio", "features", "lease",
        "outlier", ...); False if this input is already in the file."""
        key = _key(item_id, path, stage)
        if key in self._seen:
            return False
        self._seen.add(key)
        record = {"item_id": item_id, "path": path, "reason": reason, "stage": stage,
                  "time": time.time()}  # fmt: skip
        self._file.write(json.dumps(record) + "\n")
        if stage != "metadata":
            os.fsync(self._file.fileno())  # line-buffered: the line is in the file already
        self.count += 1
        return True

    def earlier_skips(self, index: CorpusIndex) -> dict[int, tuple[str, str]]:
        """item -> (reason, stage) of the items already in the file (not metadata lines)."""
        found = {}
        for r in self.earlier:
            item = index.find(r["item_id"]) if r["stage"] != "metadata" else None
            if item is not None:
                found[item] = (str(r.get("reason", "")), r["stage"])
        return found

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


def _ends_torn(path: Path) -> bool:
    """True if the file's last byte is not a newline (its last line was cut short)."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return False
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) != b"\n"


def _key(item_id: str, path: str, stage: str) -> tuple[str, str]:
    return ("line", path) if stage == "metadata" else ("item", item_id)


def read_quarantine(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records of a quarantine file, in order; a torn last line (a crash) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # only a line cut short by a crash can be malformed
            continue
        if isinstance(record, dict) and {"item_id", "path", "stage"} <= record.keys():
            records.append(record)
    return records
