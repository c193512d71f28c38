"""Per-sample functions a producer can run: a corpus's audio, or computed items.

A source maps an item index (0..n_items-1, the order of the dataset file) to a
:class:`producer.sample.Sample` or raises :class:`producer.sample.SkipSample`.
The stager reads the same item list through shared.corpus.open.open_prepared,
without any audio code: the index preparation built (producer/prepare/prepare.py).

Tests and benchmarks may wrap the source with a hook (RINGFEED_SOURCE_HOOK,
shared/config/config.py source_hook), e.g. to inject faults (tests/support/fault_sources.py);
production code never does, and nothing here ends a process or sleeps.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Protocol

import numpy as np

from ringfeed.producer.sample import Sample, run_stage
from ringfeed.shared.config import Config
from ringfeed.shared.config.environment import SOURCE_HOOK_ENV, source_hook
from ringfeed.shared.corpus.formats import synthetic
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.corpus.open import open_prepared
from ringfeed.shared.corpus.registry import format_of
from ringfeed.shared.run.id_tables import padding_ids


class Source(Protocol):
    """Per-sample work of one producer process (called by producer/process/worker.py). prepare
    raises what producer/sample.py run_stage names: SkipSample, StageFailed or
    StageTimeout, each carrying the stage it came from."""

    n_items: int

    def item_id(self, item: int) -> str: ...

    def path(self, item: int) -> str: ...

    def warm_up(self) -> None: ...

    def prepare(self, item: int, epoch: int = 0) -> Sample:
        """The item's sample in plan epoch `epoch` (which picks its reference clip); the
        worker passes a grant's position // n_items (consumer/stager/plan/plan.py, epoch_of)."""
        ...

    def work(self) -> dict[str, int]: ...


def synthetic_stamp(item: int, cfg: Config) -> int:
    """The token id SyntheticSource writes first for `item`: inside the vocabulary, so a
    model can train on synthetic data, and distinct for neighbouring items."""
    return 3 + item % (cfg.vocab_size - 3)


def synthetic_tokens(item: int, n: int, cfg: Config) -> np.ndarray:
    """Every token of a synthetic item: row i is (stamp + i) within the vocabulary."""
    span = cfg.vocab_size - 3
    return (3 + (item + np.arange(n, dtype=np.int64)) % span).astype(np.int32)


def synthetic_fields(item: int, text_len: int, n_frames: int, cfg: Config) -> dict:
    """The optional fields of a synthetic item (every field of the declared schema past
    tokens and mel): each a pure function of the item, its length following the mel, the
    text, 1 + item % its rows (own) or its shape (none); values
    item % synthetic.STAMP_BASE + k % 97 for the k-th value, cast to the field's dtype, so
    a row names its item."""
    out = {}
    low = item % synthetic.STAMP_BASE
    for f in cfg.schema.extras:
        n = {"frames": n_frames, "tokens": text_len, "own": 1 + item % f.shape[0]}.get(
            f.length, f.shape[0]
        )
        shape = f.shape if f.length == "none" else (n, *f.inner)
        k = np.arange(int(np.prod(shape)), dtype=np.int64)
        out[f.name] = (low + k % 97).reshape(shape).astype(f.dtype)
    return out


class SyntheticSource:
    """Precomputed samples: the transport's own cost and a checkable payload.

    Every row says which item and which row it is: tokens are
    :func:`synthetic_tokens`, and mel row r holds (item's low stamp, r, item's high
    stamp) in its first three columns (shared/corpus/formats/synthetic.py stamps) over a
    shared block of random values, so a consumer can check every
    row it receives against the item it claims to be (:func:`check_synthetic_rows`,
    called by tests/support/checks.py ``consume`` and the soak). Lengths vary with the item
    so padding is exercised: tokens 20..max_text_len, frames max_frames/2..max_frames.
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.n_items = cfg.data.synthetic_items
        self.index = synthetic.SyntheticIndex(cfg)
        rng = np.random.default_rng(0)
        fields = cfg.sample_fields()
        name = "mel" if "mel" in fields else "wave"
        self._name = name
        self._block = rng.standard_normal(fields[name][0], dtype=np.float32)
        self._rows = np.arange(self._block.shape[0], dtype=np.float32)
        # synthetic_tokens(item, n) is _cycle[item % span:][:n]: a view, not made anew.
        self._span = cfg.vocab_size - 3
        self._cycle = synthetic_tokens(0, self._span + cfg.text.max_text_len, cfg)
        self._cycle.setflags(write=False)  # shared by every item: an edit in place raises
        self._extras = bool(cfg.schema.extras)

    def item_id(self, item: int) -> str:
        return synthetic.item_id(item)

    def path(self, item: int) -> str:
        return ""

    def warm_up(self) -> None:
        return None

    def work(self) -> dict[str, int]:
        return {}

    def lengths(self, item: int) -> tuple[int, int]:
        return synthetic.lengths(item, self.cfg)

    def prepare(self, item: int, epoch: int = 0) -> Sample:
        return run_stage("synthetic", self._sample, item)

    def _sample(self, item: int) -> Sample:
        text_len, n = self.lengths(item)
        start = item % self._span
        sample = Sample(item_id=self.item_id(item), tokens=self._cycle[start : start + text_len])
        array = self._block[:n].copy()
        low, high = synthetic.stamps(item)
        if array.ndim == 2:
            array[:, 0], array[:, 1], array[:, 2] = low, self._rows[:n], high
        else:
            array[0], array[1] = low, high
        setattr(sample, self._name, array)
        if self._extras:
            sample.fields = synthetic_fields(item, text_len, n, self.cfg)
        return sample


class RowMismatch(ValueError):
    """A delivered row is not the item it claims to be (torn, misplaced or stale)."""


def check_synthetic_rows(arrays: dict[str, np.ndarray], n_valid: int, cfg: Config) -> list[int]:
    """Check every row of one batch of synthetic items against the item it claims to be;
    returns the valid rows' item ids, raises RowMismatch. Tests and the soak call it."""
    items = [int(i) for i in arrays["items"][:n_valid]]

    def expect(ok: bool, what: str) -> None:
        if not ok:
            raise RowMismatch(what)

    expect(bool((arrays["items"][n_valid:] == -1).all()), "padding rows must say item -1")
    _check_row_marks(arrays, n_valid, cfg)
    for row, item in enumerate(items):
        text_len, n_frames = synthetic.lengths(item, cfg)
        expect(arrays["text_lens"][row] == text_len, f"row {row}: item {item} text length")
        expect(arrays["mel_lens"][row] == n_frames, f"row {row}: item {item} frame count")
        tokens, mel = arrays["tokens"][row], arrays["mel"][row]
        want = synthetic_tokens(item, text_len, cfg)
        expect(bool((tokens[:text_len] == want).all()), f"row {row}: tokens not item {item}'s")
        expect(not tokens[text_len:].any(), f"row {row}: token padding is not zero")
        low, high = synthetic.stamps(item)
        stamped = (mel[:n_frames, 0] == low).all() and (mel[:n_frames, 2] == high).all()
        expect(bool(stamped), f"row {row}: mel not item {item}'s")
        rows = np.arange(n_frames)
        expect(bool((mel[:n_frames, 1] == rows).all()), f"row {row}: mel rows out of place")
        expect(not mel[n_frames:].any(), f"row {row}: mel padding is not zero")
        if cfg.schema.extras:
            _check_fields(arrays, row, synthetic_fields(item, text_len, n_frames, cfg), cfg)
    for row in range(n_valid, len(arrays["items"])):
        expect(not arrays["tokens"][row].any() and not arrays["mel"][row].any(), "padding")
    for f in cfg.schema.extras:
        expect(bool((arrays[f.name][n_valid:] == f.pad).all()), f"{f.name}: padding rows")
    return items


def _check_row_marks(arrays: dict[str, np.ndarray], n_valid: int, cfg: Config) -> None:
    """valid marks exactly the first n_valid rows; real rows have a plan position, padding
    rows position -1 and the reserved padding ids (shared/run/id_tables.py)."""
    valid, position = arrays["valid"], arrays["position"]
    if not (valid[:n_valid].all() and not valid[n_valid:].any()):
        raise RowMismatch(f"valid marks rows {np.flatnonzero(valid).tolist()}, not 0..{n_valid}")
    if (position[:n_valid] < 0).any() or (position[n_valid:] != -1).any():
        raise RowMismatch(f"positions {position.tolist()} for {n_valid} real rows")
    speaker, language = padding_ids(cfg)
    padding = (arrays["speaker"][n_valid:] == speaker) & (arrays["language"][n_valid:] == language)
    if not padding.all():
        raise RowMismatch(f"padding rows must carry the padding ids ({speaker}, {language})")


def _check_fields(arrays: dict[str, np.ndarray], row: int, want: dict, cfg: Config) -> None:
    """Row `row` of every optional field against its item's (synthetic_fields)."""
    for f in cfg.schema.extras:
        got, exp = arrays[f.name][row], want[f.name]
        m = len(exp)
        if f.length == "own" and arrays[f.lens_name][row] != m:
            raise RowMismatch(f"row {row}: {f.lens_name} {arrays[f.lens_name][row]}, need {m}")
        if not (np.array_equal(got[:m], exp) and (got[m:] == f.pad).all()):
            raise RowMismatch(f"row {row}: {f.name} not its item's, or its padding not {f.pad}")


class DatasetSource:
    """The real TTS path: dataset entries through producer.pipeline.SamplePipeline."""

    def __init__(self, cfg: Config, index: CorpusIndex | None = None) -> None:
        from ringfeed.producer.pipeline import SamplePipeline

        self.cfg = cfg
        self.index = index if index is not None else open_prepared(cfg)
        self.n_items = self.index.n_items
        self._pipeline = SamplePipeline(cfg, index=self.index)

    def item_id(self, item: int) -> str:
        return self.index.item_id(item)

    def path(self, item: int) -> str:
        return self.index.path(item)

    def warm_up(self) -> None:
        self._pipeline.warm_up()

    def prepare(self, item: int, epoch: int = 0) -> Sample:
        entry = run_stage("metadata", self.index.entry, item)
        return self._pipeline(entry, item, epoch)

    def work(self) -> dict[str, int]:
        """How often each stage ran in this process: decoded, mels, cache_hits, ...; texts
        normalized and phonemized (not counting those the text caches answered)."""
        text = self._pipeline.text
        return dataclasses.asdict(self._pipeline.counters) | {
            "normalized": text.normalized,
            "phonemized": text.phonemized,
            **self._pipeline.read_counters(),
        }


def _import(module_name: str) -> ModuleType:
    if not module_name.endswith(".py"):
        return importlib.import_module(module_name)
    spec = importlib.util.spec_from_file_location("ringfeed_source_hook", module_name)
    if spec is None or spec.loader is None:
        raise ImportError(f"{module_name} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def base_source(cfg: Config) -> SyntheticSource | DatasetSource:
    """The per-sample work for cfg.data's corpus, as ringfeed does it (no hook): audio
    through the pipeline, or computed items where the corpus has no audio."""
    return DatasetSource(cfg) if format_of(cfg).has_audio else SyntheticSource(cfg)


def make_source(cfg: Config, base: Source | None = None) -> Source:
    """The per-sample work for cfg.data.format (or base), in a producer process, wrapped
    by the source hook when one is set."""
    source: Source = base if base is not None else base_source(cfg)
    hook = source_hook()
    return load_hook(hook)(cfg, source) if hook else source


def load_hook(spec: str) -> Callable[[Config, Source], Source]:
    """Import the source hook "package.module:callable" or "/path/to/file.py:callable"
    (a file imports from any working directory, as producers started by a launcher
    elsewhere need); errors name RINGFEED_SOURCE_HOOK."""
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"{SOURCE_HOOK_ENV}={spec!r}: write it as 'package.module:callable'")
    try:
        module = _import(module_name)
    except (ImportError, OSError) as exc:
        raise ValueError(f"{SOURCE_HOOK_ENV}={spec!r}: cannot import {module_name}: {exc}") from exc
    hook = getattr(module, name, None)
    if not callable(hook):
        raise ValueError(f"{SOURCE_HOOK_ENV}={spec!r}: {module_name} has no callable {name}")
    return hook
