"""synthetic: items with no files, computed from their number (transport tests and
benchmarks): data.synthetic_items of them, their lengths by data.synthetic_lengths.

Nothing is read or built: the index is computed (:class:`SyntheticIndex`), so
10**7 synthetic items cost nothing to index. Each item's lengths and the values
that name it in its rows are defined here, for the producers that make its
samples (producer/sources.py SyntheticSource), the stager that plans its
buckets, and the tests that check every row against its item.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, ClassVar

import numpy as np

from ringfeed.shared.config import Config, ConfigError
from ringfeed.shared.corpus.entry import BadLine, Entry
from ringfeed.shared.corpus.format import BaseFormat
from ringfeed.shared.language.codes import language_code

PREFIX = "synthetic-"
# A synthetic item's number is written in two mel columns, item % STAMP_BASE and
# item // STAMP_BASE: each stays far inside the content check's bound
# (shared/sample/content.py), and exact in float32, for up to STAMP_BASE**2 items.
STAMP_BASE = 8192


def item_id(item: int) -> str:
    return f"{PREFIX}{item:06d}"


def stamps(item: int) -> tuple[int, int]:
    """The two values that name `item` in its mel (columns 0 and 2) or wave (0 and 1)."""
    return item % STAMP_BASE, item // STAMP_BASE


def lengths(item: int, cfg: Config) -> tuple[int, int]:
    """(text_len, frames-or-samples) of a synthetic item: varied, so padding is exercised.

    data.synthetic_lengths "uniform": frames max/2..max, text 20..max_text_len.
    "ljspeech": the shape of LJSpeech's clip lengths (1..10.1 s, mean ~6.6 s: a
    Beta(4, 2.5) over 0.1..1 of the slot, drawn per item from its number), with
    text proportional to the clip (LJSpeech reads ~15 characters a second)."""
    t_max = cfg.text.max_text_len
    wave = cfg.features.device != "producer"
    n_max = cfg.sample_fields()["wave" if wave else "mel"][0][0]
    # A wave of n samples has 1 + n // hop_length frames: one of the whole field's
    # max_frames x hop_length had one frame too many, and was skipped as too long for
    # its bucket (an item in ~49 at a small hop).
    if wave:
        n_max -= 1
    if cfg.data.synthetic_lengths == "ljspeech":
        frac = 0.1 + 0.9 * float(np.random.default_rng([item, 7]).beta(4.0, 2.5))
        n = max(1, int(frac * n_max))
        return max(1, min(t_max, int(frac * t_max))), n
    text_len = 20 + (item * 7919) % max(1, t_max - 19) if t_max > 20 else t_max
    n = n_max // 2 + (item * 104729) % max(1, n_max - n_max // 2 + 1)
    return min(text_len, t_max), min(n, n_max)


class SyntheticIndex:
    """The index of data.synthetic_items computed items (shared/corpus/index.py's face):
    one speaker (""), data.language, no audio, no bad lines."""

    has_audio = False
    bad_lines: tuple[BadLine, ...] = ()
    shard_starts = None
    root = ""
    plan_hash_before = ""
    location = "(computed: data.format synthetic)"

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.n_items = cfg.data.synthetic_items
        self.digest = self.plan_hash = hashlib.blake2b(
            f"synthetic:{self.n_items}".encode(), digest_size=8
        ).hexdigest()
        self.speakers: tuple[str, ...] = ("",)
        self.languages: tuple[str, ...] = (language_code(cfg.data.language),)
        self.speaker_ids = self.language_ids = np.broadcast_to(np.int32(0), (self.n_items,))

    def item_id(self, item: int) -> str:
        return item_id(item)

    def path(self, item: int) -> str:
        return ""

    def entry(self, item: int) -> Entry:
        return Entry(item_id(item), "", "", "", self.languages[0])

    @property
    def entries(self) -> list[Entry]:
        return [self.entry(k) for k in range(self.n_items)]

    def find(self, name: str) -> int | None:
        number = name.removeprefix(PREFIX)
        found = int(number) if number.isdigit() else -1
        return found if 0 <= found < self.n_items else None

    def stored_lengths(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Every item's (frames, tokens), whatever the key: they are computed."""
        frames, text = self._lengths()
        return frames.copy(), text.copy()

    def save_lengths(self, frames: Any, text: Any, key: str) -> None:
        return None  # computed again whenever asked

    @functools.cache  # noqa: B019 - one index a process, kept for its life
    def _lengths(self) -> tuple[np.ndarray, np.ndarray]:
        pairs = np.array([lengths(k, self.cfg) for k in range(self.n_items)], np.int32)
        pairs = pairs.reshape(-1, 2)
        return pairs[:, 1].copy(), pairs[:, 0].copy()


class Synthetic(BaseFormat):
    name: ClassVar[str] = "synthetic"
    has_audio: ClassVar[bool] = False

    def check(self, cfg: Config) -> None:
        super().check(cfg)
        if cfg.features.n_mels < 3:  # each row names its item in three columns
            raise ConfigError("features.n_mels: synthetic items need 3 mel columns or more")
        if cfg.data.synthetic_items > STAMP_BASE**2:  # the stamps name at most that many
            raise ConfigError(f"data.synthetic_items: at most {STAMP_BASE**2}")

    def computed_index(self, cfg: Config) -> SyntheticIndex:
        return SyntheticIndex(cfg)

    def locate(self, cfg: Config) -> str:
        return self.root(cfg)

    def root(self, cfg: Config) -> str:
        return ""

    def stamp(self, cfg: Config) -> Any:
        return ["synthetic", cfg.data.synthetic_items]

    def scan(self, cfg: Config, builder: Any) -> None:
        raise NotImplementedError("synthetic items are computed, never scanned")

    def parse(self, lines: list[bytes], context: Any) -> list[tuple | str]:
        raise NotImplementedError("synthetic items are computed, never parsed")
