"""Speaker and language ids: the tables that give each name its int32 id.

Built once per run by the stager from the dataset index (:func:`settle_tables`),
in a stable order (sorted names), and written to ``<run_dir>/ids.json``; the
trainer copies that file into every checkpoint's sidecar, and a run directory
that lost ids.json takes its newest checkpoint's copy. The stager writes each
batch row's ids from these tables, by item (never from what a producer says, so
a lying producer cannot relabel a clip), into the batch fields ``speaker`` and
``language``.

A resumed run (the same run directory) keeps its table: the ids of known names
never change, whatever the corpus now holds. A corpus with names the table lacks
is refused, naming them, unless ``data.new_ids: append`` (then they get the next
free ids). Refusal is the default because the model's embedding rows for new
names were never trained, and a silent append would hide a corpus mix-up (the
wrong data.path) behind a run that goes on. Ids are bounded by data.max_speakers
and data.max_languages, the sizes of the model's embedding tables, which are
fixed so that appending names never changes a weight's shape.

Padding rows (the rows past a batch's real ones) carry a reserved id that no name
ever gets, the last of each table: speaker data.max_speakers - 1, language
data.max_languages - 1 (:func:`padding_ids`), so a count of languages or speakers
over a batch's rows never counts a padding row as a real name, and an embedding
lookup of a padding row stays in the table (the rows are also marked by the batch
field ``valid``; a masked loss leaves the reserved rows untrained).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.config.loader import ConfigError
from ringfeed.shared.corpus.index import CorpusIndex

IDS_FILE = "ids.json"
# Where the trainer keeps checkpoints in a run directory (consumer/trainer/checkpoint.py).
CHECKPOINTS = "checkpoints"
# Names a refusal lists at most (the message stays readable).
MAX_NAMES_SHOWN = 10


@dataclass(frozen=True)
class IdTables:
    """speakers[i] is the name of speaker id i; languages[j] the code of language id j.
    A corpus that names no speaker has the one speaker ""."""

    speakers: tuple[str, ...]
    languages: tuple[str, ...]

    def to_dict(self) -> dict[str, list[str]]:
        return {"speakers": list(self.speakers), "languages": list(self.languages)}

    @classmethod
    def from_dict(cls, raw: Any) -> IdTables:
        """From to_dict's mapping; raises ValueError if it is not one."""
        if not isinstance(raw, dict):
            raise ValueError("not a mapping")
        parts = [raw.get("speakers"), raw.get("languages")]
        if not all(isinstance(p, list) and all(isinstance(n, str) for n in p) for p in parts):
            raise ValueError("speakers and languages must be lists of strings")
        return cls(tuple(parts[0]), tuple(parts[1]))

    def item_ids(self, index: CorpusIndex) -> tuple[np.ndarray, np.ndarray]:
        """(speaker int32 [n_items], language int32 [n_items]) of every item; every name
        must be in the tables (settle_tables makes sure). From a mapped corpus index whose
        tables are the run's, its own arrays, read one item at a time (ItemArray:
        np.asarray gives the whole): nothing of n_items size in the stager's heap."""
        return _lookup(self.speakers, index.speakers, index.speaker_ids), _lookup(
            self.languages, index.languages, index.language_ids
        )


def _lookup(table: Sequence[str], names: Sequence[str], ids: np.ndarray) -> np.ndarray:
    """The index's ids (into `names`) as ids into the run's table, one array operation."""
    if tuple(table) == tuple(names):  # the run's table is the corpus's: no copy of 4n bytes
        return ids
    ours = {name: k for k, name in enumerate(table)}
    remap = np.array([ours[n] for n in names] or [0], np.int32)
    return remap[np.asarray(ids)] if len(ids) else np.zeros(0, np.int32)


def corpus_tables(cfg: Config, index: CorpusIndex) -> IdTables:
    """The names in the corpus, each table sorted: the same corpus gives the same ids."""
    return IdTables(tuple(index.speakers), tuple(index.languages))


def read_tables(directory: Path) -> IdTables | None:
    """The run's tables: directory/ids.json, or if that is gone the copy in its newest
    checkpoint (checkpoints/ckpt-<step>.json, "ids"); None for a run with neither."""
    path = Path(directory) / IDS_FILE
    try:
        return IdTables.from_dict(json.loads(path.read_text("utf-8")))
    except FileNotFoundError:
        return _checkpoint_tables(Path(directory) / CHECKPOINTS)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path}: unreadable id table ({exc}): restore it, or start a new run"
        ) from None


def _checkpoint_tables(folder: Path) -> IdTables | None:
    sidecars = sorted(folder.glob("ckpt-*.json"), key=lambda p: _step(p.stem), reverse=True)
    for path in sidecars:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a damaged sidecar: the checkpoint loader passes it over too
        if isinstance(raw, dict) and "ids" in raw:
            try:
                return IdTables.from_dict(raw["ids"])
            except ValueError:
                continue
    return None


def _step(stem: str) -> int:
    number = stem.removeprefix("ckpt-")
    return int(number) if number.isdigit() else -1


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:MAX_NAMES_SHOWN])
    more = len(names) - MAX_NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def merge_tables(cfg: Config, kept: IdTables, corpus: IdTables) -> IdTables:
    """The run's table `kept` with the corpus's new names appended (data.new_ids: append),
    or ConfigError naming them (refuse)."""
    new_speakers = [n for n in corpus.speakers if n not in set(kept.speakers)]
    new_languages = [n for n in corpus.languages if n not in set(kept.languages)]
    if not new_speakers and not new_languages:
        return kept
    if cfg.data.new_ids == "refuse":
        what = []
        if new_speakers:
            what.append(f"speakers {_names(new_speakers)}")
        if new_languages:
            what.append(f"languages {_names(new_languages)}")
        raise ConfigError(
            f"data.new_ids: the corpus has {' and '.join(what)} that this run's id table "
            f"({IDS_FILE}, kept in every checkpoint) does not know, so the model has no "
            "trained embedding for them: check data.path, or set data.new_ids: append to "
            "give them new ids, or start a new run"
        )
    return IdTables(kept.speakers + tuple(new_speakers), kept.languages + tuple(new_languages))


def padding_ids(cfg: Config) -> tuple[int, int]:
    """(speaker, language) of a padding row: the last id of each table, never a name's."""
    return cfg.data.max_speakers - 1, cfg.data.max_languages - 1


def check_capacity(cfg: Config, tables: IdTables) -> None:
    """Every name gets an id below the table's last, which padding rows keep."""
    for key, n, cap in (
        ("data.max_speakers", len(tables.speakers), cfg.data.max_speakers),
        ("data.max_languages", len(tables.languages), cfg.data.max_languages),
    ):
        if n > cap - 1:
            raise ConfigError(
                f"{key}: the run has {n} names but {key}={cap} holds {cap - 1} "
                "(its last id marks padding rows): raise it"
            )


def settle_tables(cfg: Config, index: CorpusIndex, directory: Path) -> IdTables:
    """The run's tables (called once by the stager at start): the corpus's on a fresh run,
    the run's own (with new names appended if allowed) on a resumed one; written back to
    directory/ids.json atomically. Raises ConfigError naming what to change."""
    corpus = corpus_tables(cfg, index)
    kept = read_tables(directory)
    tables = corpus if kept is None else merge_tables(cfg, kept, corpus)
    check_capacity(cfg, tables)
    path = Path(directory) / IDS_FILE
    tmp = path.with_name(f".{IDS_FILE}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(tables.to_dict(), ensure_ascii=False, indent=1), "utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no .ids.json.<pid> left behind by a failed write
        raise
    return tables
