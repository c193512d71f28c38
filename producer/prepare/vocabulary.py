"""The token vocabulary of a corpus: every character of its normalized (or phonemized)
texts, for text.alphabet. Written by preparation beside the index
(``vocab-<key>.json``), and `ringfeed vocab CONFIG` prints it (scripts/cli_data.py).

Counted in the text pass of preparation (producer/prepare/lengths.py) with the
producers' own encoder, so the vocabulary is exactly what the producers will tokenize
(any script, or IPA with text.tokens: phonemes); the results land in the persistent
text cache, so the producers' first epoch then costs lookups. Characters are ordered
by code point, so the same corpus always gives the same ids; characters seen fewer
than min_count times are reported with the first item that has them (a stray symbol,
a typo, another script), and left out when min_count asks. A text the encoder fails on
costs that text: it is counted and named in ``failed`` (the producers will skip it
too). The key hashes the corpus digest and what decides a cleaned text (the text
settings but the alphabet and the lengths, the normalizer's version): a new alphabet
keeps it current.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringfeed.producer.text.encoder import TextEncoder
from ringfeed.producer.text.normalize import NORMALIZER_VERSION
from ringfeed.shared.config import Config
from ringfeed.shared.corpus.entry import Entry
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.memory_copies import places, write_kept

log = logging.getLogger(__name__)

# The text settings that do not change a cleaned text (only how it is tokenized or cut).
NOT_CLEANING = ("alphabet", "max_text_len", "add_eos", "max_unknown_frac")


@dataclass(frozen=True)
class Vocabulary:
    """alphabet: the characters kept, by code point; rare: (char, count, an item id) of
    those seen fewer than min_count times; texts: how many texts were read; failed:
    (item id, reason) of the texts that could not be cleaned."""

    alphabet: str
    rare: tuple[tuple[str, int, str], ...]
    texts: int
    failed: tuple[tuple[str, str], ...] = ()


@dataclass
class Tally:
    """The characters of cleaned texts, counted: char -> [count, first item]; the texts
    read and those that failed (item, reason). Merged in any order, it is the same."""

    chars: dict[str, list[int]] = field(default_factory=dict)
    failed: list[tuple[int, str]] = field(default_factory=list)
    texts: int = 0

    def add(self, encoder: TextEncoder, item: int, entry: Entry) -> None:
        self.texts += 1
        try:
            text = encoder.clean(entry.text, entry.language)
        except Exception as exc:  # noqa: BLE001 - one text's failure costs that text
            self.failed.append((item, f"{type(exc).__name__}: {exc}"))
            return
        for char, n in collections.Counter(text).items():
            seen = self.chars.get(char)
            if seen is None:
                self.chars[char] = [n, item]
            else:
                seen[0] += n
                seen[1] = min(seen[1], item)

    def merge(self, other: Tally) -> None:
        self.texts += other.texts
        self.failed += other.failed
        for char, (n, item) in other.chars.items():
            seen = self.chars.setdefault(char, [0, item])
            seen[0] += n
            seen[1] = min(seen[1], item)

    def to_dict(self) -> dict[str, Any]:
        return {"chars": self.chars, "failed": self.failed, "texts": self.texts}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Tally:
        return cls(dict(raw["chars"]), [tuple(f) for f in raw["failed"]], raw["texts"])


def vocabulary_key(cfg: Config, digest: str) -> str:
    """A hash of the corpus digest and what decides its cleaned texts."""
    text = {k: v for k, v in cfg.to_dict()["text"].items() if k not in NOT_CLEANING}
    raw = json.dumps([digest, text, NORMALIZER_VERSION], sort_keys=True, default=str)
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def vocabulary_path(cfg: Config, digest: str) -> Path:
    return Path(cfg.features.cache_dir).absolute() / f"vocab-{vocabulary_key(cfg, digest)}.json"


def vocabulary_record(cfg: Config, index: CorpusIndex, tally: Tally) -> dict[str, Any]:
    """The tally as the vocabulary file holds it: examples and failures by item id."""
    if tally.failed:
        item, why = min(tally.failed)
        log.warning(
            "vocabulary: %d texts could not be cleaned, first %s: %s",
            len(tally.failed),
            index.item_id(item),
            why,
        )
    return {
        "key": vocabulary_key(cfg, index.digest),
        "texts": tally.texts,
        "chars": {c: [n, index.item_id(item)] for c, (n, item) in sorted(tally.chars.items())},
        "failed": [[index.item_id(item), why] for item, why in sorted(tally.failed)],
    }


def keep_vocabulary(cfg: Config, digest: str, record: dict[str, Any]) -> Path:
    """The vocabulary file, beside the index or, on a full disk, in memory; returns where."""

    def write(there: Path) -> None:
        there.parent.mkdir(parents=True, exist_ok=True)
        tmp = there.with_name(f".{there.name}.tmp")
        try:
            tmp.write_text(json.dumps(record, indent=0), "utf-8")  # ASCII: lone surrogates too
            tmp.replace(there)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    return write_kept(vocabulary_path(cfg, digest), write)


def read_record(cfg: Config, digest: str) -> dict[str, Any] | None:
    """The corpus's vocabulary file when it is current, else None."""
    for place in places(vocabulary_path(cfg, digest)):
        try:
            record = json.loads(place.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("key") == vocabulary_key(cfg, digest):
            return record
    return None


def vocabulary(record: dict[str, Any], min_count: int = 1, rare_below: int = 3) -> Vocabulary:
    """The vocabulary of a record: characters seen >= min_count times; those seen fewer
    than max(min_count, rare_below) times are reported as rare."""
    threshold = max(min_count, rare_below)
    chars = record["chars"]
    rare = tuple((c, n, item) for c, (n, item) in sorted(chars.items()) if n < threshold)
    alphabet = "".join(sorted(c for c, (n, _) in chars.items() if n >= min_count))
    failed = tuple((item, why) for item, why in record["failed"])
    return Vocabulary(alphabet, rare, record["texts"], failed)
