"""What a producer's per-sample work returns, the sample in progress, and how a stage
says no.

Called in producer processes only. Arrays are unpadded; the worker pads them
into the fixed-shape slot (shared/memory/ring.py) without an extra copy.

A stage of one sample's work (producer/pipeline.py) ends it three ways, each carrying
the stage, so the worker never asks where the work was: :class:`SkipSample` (the input
cannot be used: a verdict with its reason), :class:`StageFailed` (an exception nobody
expected: the stage and the exception, whose traceback says where) and
:class:`StageTimeout` (the sample's time ran out in that stage: a
producer/process/watchdog.py SampleTimeout, so that no ``except Exception`` in the work can
swallow it). :func:`run_stage` is the one place that names them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from ringfeed.producer.process.watchdog import SampleTimeout
from ringfeed.shared.corpus.entry import Entry

# The stage of a failure that came from no stage of ours (a source hook around a source).
OUTSIDE_STAGES = "source"

T = TypeVar("T")


@dataclass
class Sample:
    """One prepared sample.

    tokens: int32 [text_len]; mel: float32 [n_frames, n_mels] (features.device:
    producer) or None; wave: float32 [n_samples] at audio.sample_rate
    (features.device: stager) or None. truncated is set when
    features.on_too_long: truncate cut the clip. marks: the clip's audio marks
    (shared/sample/marks.py AUDIO bits: near-silent, clipped; MEL: wave holds the clip's
    cached log-mel [n_frames, n_mels], flattened). fields: the optional fields of the
    declared schema (shared/sample/schema.py) by name: pitch, voiced, energy and the
    user's, unpadded (axis 0 the true length). cache_key: the clip's feature-cache key,
    under which the stager keeps the mel it computes of wave (b'': none to keep), and
    clip_marks: the clip's marks as the cache keeps them (marks.ALL).
    """

    item_id: str
    tokens: np.ndarray
    mel: np.ndarray | None = None
    wave: np.ndarray | None = None
    truncated: bool = False
    marks: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    fields: dict[str, np.ndarray] = field(default_factory=dict)
    cache_key: bytes = b""
    clip_marks: int = 0

    def array(self, name: str) -> np.ndarray:
        """The unpadded array of field `name` (tokens, mel, wave or an optional one)."""
        if name in ("tokens", "mel", "wave"):
            return getattr(self, name)
        return self.fields[name]


@dataclass
class Work:
    """One sample in progress, handed from stage to stage (producer/pipeline.py) and
    never shared: the entry and where it sits in the plan (item, epoch: -1, 0 when the
    caller has none), then what the stages make of it. array: the mel float32
    [n_frames, n_mels] (features.device: producer, or marks MEL) or the wave float32
    [n_samples]; marks: shared/sample/marks.py bits; fields: the optional fields by
    name; cache_key, clip_marks: as Sample's."""

    entry: Entry
    item: int = -1
    epoch: int = 0
    tokens: np.ndarray | None = None
    text_truncated: bool = False
    array: np.ndarray | None = None
    marks: int = 0
    fields: dict[str, np.ndarray] = field(default_factory=dict)
    cache_key: bytes = b""
    clip_marks: int = 0


@dataclass
class PipelineCounters:
    """How many times each stage ran in this process (cache hits skip decode and mel): the
    work counters of a producer's heartbeats (producer/sources.py DatasetSource.work)."""

    samples: int = 0
    skipped: int = 0
    decoded: int = 0
    mels: int = 0
    # Samples whose optional fields (pitch, energy, the user's) were computed, not cached.
    extras: int = 0
    # Samples whose speaker has no other clip that reads: its own reference
    # (features.single_clip: own).
    reference_own: int = 0
    # Reference candidates that could not be read (each remembered, tried once here).
    reference_failed: int = 0
    cache_hits: int = 0
    cache_errors: int = 0
    # Samples not written to the cache because it stopped writing after repeated failures.
    cache_writes_off: int = 0


class SkipSample(Exception):  # noqa: N818 - it is a verdict, not an error of ours
    """The input cannot be used; reason is a short specific sentence for the quarantine,
    stage where it was found (run_stage fills it in when the raiser did not)."""

    def __init__(self, reason: str, path: str = "", stage: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.path = path
        self.stage = stage


class StageFailed(Exception):  # noqa: N818 - it carries the error, it is none of its own
    """An exception nobody expected in `stage`; error: that exception (its traceback
    says where in the code)."""

    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__} in {stage}: {error}")
        self.stage, self.error = stage, error


class StageTimeout(SampleTimeout):
    """The sample's time (ring.lease_s) ran out in `stage`: still a SampleTimeout, a
    BaseException that no ``except Exception`` in the work swallows."""

    def __init__(self, stage: str, said: str) -> None:
        super().__init__(said)
        self.stage = stage


def run_stage(stage: str, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) as stage `stage`: a SkipSample that names no stage gets this one, any
    other exception becomes StageFailed and a timeout StageTimeout of this stage; what an
    inner stage named keeps its name (a stage may run stages of its own)."""
    try:
        return fn(*args)
    except SkipSample as skip:
        skip.stage = skip.stage or stage
        raise
    except (StageFailed, StageTimeout):
        raise
    except SampleTimeout as late:
        raise StageTimeout(stage, str(late)) from late
    except Exception as exc:
        raise StageFailed(stage, exc) from exc


def stage_of(exc: BaseException) -> str:
    """The stage a failure of one sample's work came from; OUTSIDE_STAGES for one raised
    by no stage (a source hook)."""
    if isinstance(exc, SkipSample | StageFailed | StageTimeout) and exc.stage:
        return exc.stage
    return OUTSIDE_STAGES


def error_of(exc: Exception) -> BaseException:
    """The exception a worker reports: the one a stage failed with, or exc itself."""
    return exc.error if isinstance(exc, StageFailed) else exc
