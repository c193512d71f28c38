"""The declared sample schema: every field of a sample, declared once.

A field is a name, a dtype, a fixed shape whose axis 0 may be a length axis, and
a pad value. The length axis is tied to one of:

- ``frames``: the mel frames (mel, pitch, voiced, energy; its length must equal
  the mel's), cut by a length bucket to the bucket's frames;
- ``tokens``: the tokens (tokens, durations; its length must equal the text's),
  cut by a bucket to the bucket's text length;
- ``own``: its own length up to shape[0] (a reference clip's mel), never cut by a
  bucket; the batch carries ``<name>_lens``;
- ``none``: no length axis: the whole shape, every row (an emotion label [1], a
  style embedding [256]).

Everything else derives from :func:`sample_schema`: the sample-ring slot
(:meth:`SampleSchema.slot_fields`), the batch-ring slot (:meth:`batch_ring_fields`,
flat so one slot holds a batch of any bucket's shape), the batch shapes
(:meth:`batch_fields`, :meth:`batch_specs`), the views of one batch inside a slot
(:meth:`batch_views`), the consistency of a READY's lengths
(:meth:`lengths_error`) and the sizes ``ringfeed validate`` and the inspector print.
The built-in fields are declared the same way as the user's
(``features.user_fields``); speaker and language ids are batch fields the stager
writes from the item's entry, never sample slots.

Called in every process (no TensorFlow here).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

Length = Literal["frames", "tokens", "own", "none"]
FieldSpec = dict[str, tuple[tuple[int, ...], np.dtype]]

# Fields one sample holds at most: its slot header's lengths (shared/memory/ring.py MAX_LENGTHS)
# and a remote READY's payload frames (shared/wire/protocol.py MAX_PAYLOAD_FRAMES) follow.
MAX_SAMPLE_FIELDS = 16
# The batch shape (rows, frames, text) of a place that is a spare-ring slot, not a row of
# a batch: it holds a sample of any length bucket (shared/memory/places.py).
SPARE_SHAPE = (0, 0, 0)
# Batch fields the stager writes itself, int32 per row, after the sample's fields'.
ID_FIELDS = ("speaker", "language")
# Batch fields that say where each row comes from, not what it holds: its item (-1 for a
# padding row) and its plan position (-1 for a padding row). No model input.
ROW_SOURCE_FIELDS = ("items", "position")
# The batch field that says how many rows of a length axis are real.
LENS_OF = {"tokens": "text_lens", "frames": "mel_lens"}
# Names the built-ins use, in the sample or the batch: no user field may take one.
RESERVED = frozenset(
    {
        "tokens",
        "mel",
        "wave",
        "ref_mel",
        "pitch",
        "voiced",
        "energy",
        "durations",
        "text_lens",
        "mel_lens",
        "valid",
        *ROW_SOURCE_FIELDS,
        *ID_FIELDS,
    }
)


@dataclass(frozen=True)
class FieldDecl:
    """One declared sample field. shape: its slot shape; axis 0 is the length axis
    unless length is "none". origin: "builtin" or "user" (features.user_fields)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    length: Length
    pad: float = 0.0
    origin: str = "builtin"

    @property
    def inner(self) -> tuple[int, ...]:
        """The shape of one row of the length axis (the whole shape for "none")."""
        return self.shape if self.length == "none" else self.shape[1:]

    @property
    def slot_bytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    @property
    def lens_name(self) -> str:
        """The batch field of this field's true lengths ('' for length "none")."""
        if self.length == "own":
            return f"{self.name}_lens"
        return LENS_OF.get(self.length, "")


@dataclass(frozen=True)
class SampleSchema:
    """The fields of one sample in ring order (tokens, then mel or wave, then the
    optional ones), with the limits that shape a batch."""

    fields: tuple[FieldDecl, ...]
    max_frames: int
    max_text_len: int
    mel_bins: int  # n_mels: the batch's mel when the slots hold waves
    hop_length: int = 0  # samples a mel frame steps: how long a wave of n frames may be

    def __getitem__(self, name: str) -> FieldDecl:
        return self.by_name[name]

    @functools.cached_property
    def by_name(self) -> dict[str, FieldDecl]:
        return {f.name: f for f in self.fields}

    @property
    def extras(self) -> tuple[FieldDecl, ...]:
        """Fields past tokens and mel (or wave): the optional ones, in ring order."""
        return self.fields[2:]

    def slot_fields(self) -> FieldSpec:
        """Payload fields of one sample-ring slot: name -> (shape, dtype), ring order."""
        return {f.name: (f.shape, f.dtype) for f in self.fields}

    def _batch_decls(self) -> list[FieldDecl]:
        """The fields a batch holds: mel in place of wave (the stager computes it)."""
        out = []
        for f in self.fields:
            if f.name == "wave":
                f = FieldDecl(
                    "mel", np.dtype(np.float32), (self.max_frames, self.mel_bins), "frames"
                )
            out.append(f)
        return out

    def _batch_entries(
        self, rows: int, frames: int, text: int, flat: bool
    ) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        """(name, shape, dtype) of every batch field in batch order: tokens, text_lens,
        mel, mel_lens, items, position, valid, speaker, language, then each optional field
        (and its lens for length "own"). flat: the batch-ring slot's layout, where frames
        is the budget of mel frames of all rows together."""
        i32 = np.dtype(np.int32)
        out: list[tuple[str, tuple[int, ...], np.dtype]] = []
        tail: list[tuple[str, tuple[int, ...], np.dtype]] = []
        for k, f in enumerate(self._batch_decls()):
            if f.length == "frames":
                lead = (frames,) if flat else (rows, frames)
            elif f.length == "tokens":
                lead = (rows * text,) if flat else (rows, text)
            elif f.length == "own":
                lead = (rows * f.shape[0],) if flat else (rows, f.shape[0])
            else:
                lead = (rows,)
            entry = (f.name, (*lead, *f.inner), f.dtype)
            (out if k < 2 else tail).append(entry)
            if f.name in ("tokens", "mel"):
                out.append((f.lens_name, (rows,), i32))
            elif f.length == "own":
                tail.append((f.lens_name, (rows,), i32))
        out.extend((name, (rows,), np.dtype(np.int64)) for name in ROW_SOURCE_FIELDS)
        out.append(("valid", (rows,), np.dtype(np.bool_)))  # the real rows: True
        out.extend((name, (rows,), i32) for name in ID_FIELDS)
        return out + tail

    def batch_ring_fields(self, rows: int, frames_budget: int) -> FieldSpec:
        """Payload fields of one batch-ring slot, flat: a batch of any bucket's shape
        [rows, frames, ...] is the first rows x frames entries (batch_views)."""
        entries = self._batch_entries(rows, frames_budget, self.max_text_len, True)
        return {name: (shape, dtype) for name, shape, dtype in entries}

    def batch_fields(self, rows: int) -> FieldSpec:
        """The fixed batch shapes (no buckets): [rows, max_frames or max_text_len, ...]."""
        entries = self._batch_entries(rows, self.max_frames, self.max_text_len, False)
        return {name: (shape, dtype) for name, shape, dtype in entries}

    def batch_specs(
        self, rows: int, bucketed: bool
    ) -> dict[str, tuple[tuple[int | None, ...], np.dtype]]:
        """Batch shapes as a model or tf.data sees them: fixed, or with length buckets
        None for the rows and for each length axis a bucket cuts (frames, tokens)."""
        fixed = self.batch_fields(rows)
        if not bucketed:
            return dict(fixed)
        cut = {f.name for f in self._batch_decls() if f.length in ("frames", "tokens")}
        out: dict[str, tuple[tuple[int | None, ...], np.dtype]] = {}
        for name, (shape, dtype) in fixed.items():
            out[name] = ((None, None, *shape[2:]) if name in cut else (None, *shape[1:]), dtype)
        return out

    def batch_views(
        self, slot: Mapping[str, np.ndarray], rows: int, frames: int, text: int
    ) -> dict[str, np.ndarray]:
        """One batch of shape (rows, frames, text) inside a batch-ring slot whose fields
        are flat (batch_ring_fields): zero-copy views, row-major from each field's
        start. The one definition of that layout, for the stager's builder and the
        batch client."""
        shapes = self._views.get((rows, frames, text))
        if shapes is None:
            shapes = self._views[rows, frames, text] = self._view_shapes(rows, frames, text)
        return {name: slot[name][:n].reshape(shape) for name, shape, n in shapes}

    @functools.cached_property
    def _views(self) -> dict[tuple[int, int, int], tuple]:
        """_view_shapes by batch shape: batch_views runs per batch, with a few shapes."""
        return {}

    def _view_shapes(self, rows: int, frames: int, text: int) -> tuple:
        """(name, batch shape, entries of the flat field it takes) of each batch field."""
        out = []
        for name, shape, _ in self._batch_entries(rows, frames, text, False):
            n = shape[0] * shape[1] if len(shape) > 1 and self._is_axis(name) else shape[0]
            out.append((name, shape, n))
        return tuple(out)

    @functools.cached_property
    def _axis_names(self) -> frozenset[str]:
        """Batch fields whose flat layout folds rows and a length axis together."""
        return frozenset(f.name for f in self._batch_decls() if f.length != "none")

    def _is_axis(self, name: str) -> bool:
        return name in self._axis_names

    def place_limits(self, frames: int, text: int, mel: bool = False) -> list[int]:
        """Rows each sample field (ring order) may hold for a batch whose bucket has
        `frames` mel frames and `text` tokens, or (frames 0) for a sample of any bucket
        (a spare-ring slot granted with no batch's shape). The most a READY may claim
        there. A waveform (features.device: stager) holds fewer samples than frames x
        hop_length: a clip of n samples has 1 + n // hop_length frames; mel: the wave
        field holds the clip's cached log-mel (shared/sample/marks.py MEL), at most
        frames x mel_bins values (and a whole number of frames: mel_frames)."""
        cut = {"frames": frames, "tokens": text} if frames else {}
        out = [cut.get(f.length, f.shape[0]) for f in self.fields]
        if self.hop_length and "wave" in self.by_name:
            k = [f.name for f in self.fields].index("wave")
            per_frame = self.mel_bins if mel else self.hop_length
            wanted = (frames or self.max_frames) * per_frame - (0 if mel else 1)
            out[k] = min(wanted, self.fields[k].shape[0])  # never past the field
        return out

    @property
    def mels_fit_waves(self) -> bool:
        """Does a clip's log-mel fit where its waveform goes (features.device: stager)?
        The wave field holds max_frames x hop_length values, a mel of max_frames frames
        max_frames x mel_bins: only when mel_bins <= hop_length (80 and 256 by default);
        else a cached mel cannot be sent there, and the stager computes every mel."""
        return self.mel_bins <= self.hop_length

    def lengths_error(self, lengths: list[int]) -> str:
        """'' if a READY's lengths (ring order) agree with each other: a frames field as
        long as the mel (or its frames, for a wave), a tokens field as the text, a
        field without a length axis whole; else why not. The range of each length
        is shared/ring's row limits' business."""
        text, frames = lengths[0], lengths[1]
        for f, n in zip(self.extras, lengths[2:], strict=True):
            want = {"frames": frames, "tokens": text, "none": f.shape[0]}.get(f.length, n)
            if n != want:
                return f"{f.name} has {n} rows, need {want} (its length follows {f.length})"
        return ""

    def bytes_per_slot(self) -> int:
        return sum(f.slot_bytes for f in self.fields)

    def describe(self) -> list[str]:
        """One line per field for `ringfeed validate`: dtype, shape, length, pad, bytes."""
        lines = []
        for f in self.fields:
            tied = {
                "frames": "mel frames",
                "tokens": "tokens",
                "own": "own length",
                "none": "no length axis",
            }[f.length]
            lines.append(
                f"{f.name:<12} {f.dtype.name:<8} {str(list(f.shape)):<14} {tied:<15} "
                f"pad {f.pad:g}  {f.slot_bytes:>10,} B/slot  ({f.origin})"
            )
        return lines
