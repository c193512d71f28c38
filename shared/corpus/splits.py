"""A dataset's splits, as the Hugging Face Hub lays them out, and the one a run reads.

A dataset on the Hub keeps its splits side by side in one folder, told apart by the
names of its files and folders; ``datasets`` reads them so (datasets/data_files.py),
and so does :func:`split_of`, by the first rule that names one:

1. a file named as ``push_to_hub`` names its shards, ``<split>-00000-of-00002.parquet``
   (any split name: LibriTTS-R's ``train.clean.100``);
2. a file or folder name holding a split's word, alone or between ``-``, ``.``, ``_``,
   spaces or digits, the name nearest the file first: ``train``/``training`` (train),
   ``validation``/``valid``/``val``/``dev`` (validation), ``test``/``testing``/
   ``eval``/``evaluation`` (test): ``train.parquet``, ``test/0000.parquet``.

A folder whose files name two splits or more is read a split at a time: data.split,
``train`` by default (a test split trained on is a test split lost, silently); a folder
of one split or of none is read whole, as before. The formats whose corpus is a folder
of many files use it (shared/corpus/formats/parquet.py and shards.py); `ringfeed
validate` says which splits it found and which one it reads.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import TypeVar

from ringfeed.shared.corpus.entry import CorpusError

# The split a run reads where a folder holds several and data.split names none.
DEFAULT_SPLIT = "train"
# The words of the splits datasets knows by name (datasets' SPLIT_KEYWORDS).
SPLIT_WORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_SHARD_NAME = re.compile(r"^(?P<split>[^/]+?)-\d{5}-of-\d{5}(\.|$)")
_SEPARATORS = re.compile(r"[-._ 0-9]+")

Found = TypeVar("Found", bound=tuple)


def split_of(rel: str) -> str:
    """The split a file belongs to by its path relative to the dataset's folder ("":
    its names say none)."""
    parts = rel.split("/")
    named = _SHARD_NAME.match(parts[-1])
    if named:
        return named["split"]
    for part in reversed(parts):
        words = set(_SEPARATORS.split(part.lower()))
        for split, names in SPLIT_WORDS.items():
            if words.intersection(names):
                return split
    return ""


@dataclass(frozen=True)
class Splits:
    """What a dataset folder holds: files per split name (in name order; "" for files
    whose names say no split) and the split read ("": every file)."""

    files: dict[str, int]
    reads: str

    @property
    def named(self) -> list[str]:
        return [name for name in self.files if name]

    def describe(self) -> str:
        """One line for `ringfeed validate`."""
        found = ", ".join(
            f"{name or '(no split)'} ({n} file{'s' * (n != 1)})" for name, n in self.files.items()
        )
        if not self.reads:
            return f"{found}: reads every file"
        why = (
            "data.split"
            if self.reads != DEFAULT_SPLIT or len(self.named) < 2
            else "the default where a folder holds several; data.split chooses"
        )
        return f"{found}: reads {self.reads} ({why})"


def choose_split(found: list[Found], split: str, where: str) -> tuple[list[Found], Splits]:
    """(the files a run reads, what the folder holds): found are (path relative to the
    dataset's folder, ...) in name order; split is data.split. CorpusError naming the
    splits there are when data.split names none of them, or when the folder holds
    several and no train split."""
    names = [split_of(f[0]) for f in found]
    count = Counter(names)
    files = {name: count[name] for name in sorted(count)}
    named = [name for name in files if name]
    reads = split or (DEFAULT_SPLIT if len(named) > 1 else "")
    if reads and reads not in named:
        have = ", ".join(named) if named else "none: no file or folder name says a split"
        if split:
            raise CorpusError(
                f"data.split: no split {split!r} under {where} (its splits: "
                f"{have}): set data.split to one of them (docs/corpora.md#splits)"
            )
        raise CorpusError(
            f"data.split: {where} holds the splits {have} and no {reads}, the "
            "default: set data.split to the one to read (docs/corpora.md#splits)"
        )
    kept = [f for f, name in zip(found, names, strict=True) if not reads or name == reads]
    return kept, Splits(files, reads)
