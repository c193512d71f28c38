"""A batch that says when a step first reads it: what lets a loader's cursor follow the
batches trained, not the batches fetched (docs/loaders.md#resuming).

A client that reads ahead asks for batch k + 1 before its step trains batch k:
Lightning's fetcher does (lightning/pytorch/loops/fetchers.py _PrefetchDataFetcher,
whenever it cannot take the loader's len), and a cursor that moved when a batch was
handed out then saved one batch too far: a checkpoint after the batches at positions
0, 8, 16 and 24 said 40, and the batch at 32 was never trained (issue 49). So a
RingBatch calls `used` the first time anything reads its fields (a key, `items()`,
`values()`, iterating it: a step, Lightning's transfer to the device, accelerate's
`send_to_device`), and the loader's cursor is the one after the last batch used.

Only reading the fields counts: `len(batch)` and `"mel" in batch` do not. A copy made
from it (`dict(batch)`, a transfer to the device) is a plain batch of the same type
that reports nothing; pickling one gives a plain dict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class RingBatch(dict):
    """A dict of a batch's fields that calls `used()` once, on the first read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._used: Callable[[], None] | None = None

    @classmethod
    def reporting(cls, fields: dict[str, Any], used: Callable[[], None]) -> RingBatch:
        """The batch of `fields` that calls used() on its first read."""
        batch = cls(fields)
        batch._used = used
        return batch

    def _read(self) -> None:
        if self._used is not None:
            used, self._used = self._used, None
            used()

    def __getitem__(self, key: str) -> Any:
        self._read()
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._read()
        return super().get(key, default)

    def items(self):  # noqa: ANN201 - dict's view
        self._read()
        return super().items()

    def values(self):  # noqa: ANN201 - dict's view
        self._read()
        return super().values()

    def __iter__(self) -> Iterator[str]:
        self._read()
        return super().__iter__()

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return dict, (dict(super().items()),)
