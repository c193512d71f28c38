"""Per-sample functions a producer can run, chosen by ``data.format``.

A source maps an item index (0..n_items-1, the order of the dataset file) to a
:class:`producer.sample.Sample` or raises :class:`producer.sample.SkipSample`.
The stager builds the same source list with ``prepare=False`` to learn the
item count and ids without loading any audio code.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol

import numpy as np

from producer.sample import Sample
from shared.config import Config


class Source(Protocol):
    n_items: int

    def item_id(self, item: int) -> str: ...

    def path(self, item: int) -> str: ...

    def warm_up(self) -> None: ...

    def prepare(self, item: int) -> Sample: ...

    def work(self) -> dict[str, int]: ...


def synthetic_stamp(item: int, cfg: Config) -> int:
    """The token id SyntheticSource writes first for `item`: inside the vocabulary, so a
    model can train on synthetic data, and distinct for neighbouring items."""
    return 3 + item % (cfg.vocab_size - 3)


class SyntheticSource:
    """Precomputed full-size samples: the transport's own cost, nothing else.

    Each sample is a view of the same block of random values (no per-sample
    copy, as for a cache hit) with :func:`synthetic_stamp` of the item in
    tokens[0], so tests can check that a slot carries the item it claims to. Lengths vary
    with the item so padding is exercised: tokens 20..max_text_len, frames
    max_frames/2..max_frames.
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.n_items = cfg.data.synthetic_items
        rng = np.random.default_rng(0)
        fields = cfg.sample_fields()
        self._tokens = rng.integers(3, cfg.vocab_size, fields["tokens"][0], dtype=np.int32)
        name = "mel" if "mel" in fields else "wave"
        self._name = name
        self._block = rng.standard_normal(fields[name][0], dtype=np.float32)

    def item_id(self, item: int) -> str:
        return f"synthetic-{item:06d}"

    def path(self, item: int) -> str:
        return ""

    def warm_up(self) -> None:
        return None

    def work(self) -> dict[str, int]:
        return {}

    def lengths(self, item: int) -> tuple[int, int]:
        """(text_len, frames-or-samples) of an item."""
        t_max = self.cfg.text.max_text_len
        n_max = self._block.shape[0]
        text_len = 20 + (item * 7919) % max(1, t_max - 19) if t_max > 20 else t_max
        n = n_max // 2 + (item * 104729) % max(1, n_max - n_max // 2 + 1)
        return min(text_len, t_max), min(n, n_max)

    def prepare(self, item: int) -> Sample:
        if self.cfg.data.synthetic_delay_s > 0:
            time.sleep(self.cfg.data.synthetic_delay_s)
        text_len, n = self.lengths(item)
        tokens = self._tokens[:text_len].copy()
        tokens[0] = synthetic_stamp(item, self.cfg)
        sample = Sample(item_id=self.item_id(item), tokens=tokens)
        setattr(sample, self._name, self._block[:n])
        return sample


class DatasetSource:
    """The real TTS path: dataset entries through producer.pipeline.SamplePipeline."""

    def __init__(self, cfg: Config, prepare: bool = True) -> None:
        from producer.dataset import read_dataset

        self.cfg = cfg
        self.entries, self.bad_lines = read_dataset(cfg)
        self.n_items = len(self.entries)
        self._pipeline = None
        if prepare:
            from producer.pipeline import SamplePipeline

            self._pipeline = SamplePipeline(cfg)

    def item_id(self, item: int) -> str:
        return self.entries[item].item_id

    def path(self, item: int) -> str:
        return self.entries[item].audio_path

    def warm_up(self) -> None:
        assert self._pipeline is not None, "DatasetSource(prepare=False) cannot prepare"
        self._pipeline.warm_up()

    def prepare(self, item: int) -> Sample:
        assert self._pipeline is not None, "DatasetSource(prepare=False) cannot prepare"
        return self._pipeline(self.entries[item])

    def work(self) -> dict[str, int]:
        """How often each stage ran in this process: decoded, mels, cache_hits, ..."""
        return dataclasses.asdict(self._pipeline.counters) if self._pipeline else {}


def make_source(cfg: Config, prepare: bool = True) -> Source:
    """The source for cfg.data.format; prepare=False skips building the audio pipeline."""
    if cfg.data.format == "synthetic":
        return SyntheticSource(cfg)
    return DatasetSource(cfg, prepare=prepare)
