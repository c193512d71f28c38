"""A finished batch made ready to send: its rows checked, closed up and completed.

Called by delivery (consumer/stager/delivery.py) for each batch the slot ledger hands
on (consumer/stager/ledger.py: every position finished). Most samples were written by
their producers straight into their row of the batch slot (docs/design.md#rows-written-once)
and are not copied at all. The others are copied once, into the row they are delivered
in: a sample in a spare place (a second grant, a retry of a fenced row, a remote
producer's audited twin, an unseen producer's, a waveform when the stager computes the
mels), a sample whose row moves up because a position before it was skipped, or every
sample of a batch whose slot a stale producer may still write (it moves to another
slot). Rows past the last sample are padding, written here.

Then every row is checked as it will be sent (docs/design.md#contract-7): its place's
record still carries the accepted generation in both producer fields after the copy
(seqlock), and the row hashes to its READY's checksum (the intake checked its values when
the READY was accepted, consumer/stager/intake.py). A row that fails is torn, a stale
writer's doing (a fence lifted too early) or its producer's: it is not delivered, its
position is granted again, uncharged, and the batch waits.

The stager's own columns come last, from the ledger and the run's tables, never from a
producer: true lengths, items, plan positions, valid, speaker and language ids (padding
rows: zeros, -1, False, the padding ids of shared/run/id_tables.py). With
``features.device: stager`` the waveforms are copied into a staging array and the whole
batch's log-mels computed at once (consumer/stager/gpu_mel.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ringfeed.consumer.stager.drops import Drops
from ringfeed.consumer.stager.ledger import Ledger
from ringfeed.consumer.stager.state import Batch, Position
from ringfeed.shared.config import Config
from ringfeed.shared.memory.places import Places
from ringfeed.shared.memory.ring import rows_checksum
from ringfeed.shared.run.id_tables import padding_ids
from ringfeed.shared.run.stats_record import BuilderStats, Padding
from ringfeed.shared.sample.marks import AUDIO
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)


@dataclass
class Assembled:
    """A batch ready to announce: its slot and real rows."""

    slot: int
    n_valid: int


class Assembly:
    """Checks, closes up and completes finished batches (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        places: Places,
        ledger: Ledger,
        drop: Drops,
        mel_fn: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None,
        ids: tuple[np.ndarray, np.ndarray] | None = None,
        marked: Callable[[int, int], None] | None = None,
    ) -> None:
        """mel_fn: the stager's batch log-mel (features.device: stager), else None; ids:
        (speaker, language) int32 [n_items] from the run's id tables; marked(item, marks):
        told of each sample sent whose READY carried audio marks (near-silent, clipped:
        consumer/stager/outliers.py lists it)."""
        self.cfg, self.places, self.ledger, self.drop = cfg, places, ledger, drop
        self.mel_fn, self.marked = mel_fn, marked
        self.speaker_of, self.language_of = ids if ids is not None else (None, None)
        self.padding_ids = padding_ids(cfg)
        self.schema = cfg.schema
        self.names = places.names
        self.pads = places.pads
        self.hop = cfg.features.hop_length
        # stager mels: waveforms of up to max_frames x hop samples per row.
        wave = mel_fn is not None
        self.waves = np.zeros((cfg.max_batch_rows, cfg.max_samples), np.float32) if wave else None
        self.wave_lens = np.zeros(cfg.max_batch_rows, np.int32)
        # Over every batch sent: true mel frames, padded mel frames, true and padded tokens.
        self.filled = np.zeros(4, np.int64)
        # The producers' progress fields of every row (column views: the seqlock, per row).
        rows = places.batches.rows if places.batches is not None else None
        self.row_writing = rows["writing_generation"] if rows is not None else None
        self.row_sealed = rows["sealed_generation"] if rows is not None else None

    def stats(self) -> BuilderStats:
        """Its part of the stager's stats: batches in flight, and true / padded mel
        frames and tokens over every batch sent (None before one)."""
        true_f, pad_f, true_t, pad_t = (int(x) for x in self.filled)
        padding = Padding(
            frames=round(true_f / pad_f, 4) if pad_f else None,
            text=round(true_t / pad_t, 4) if pad_t else None,
        )
        return BuilderStats(self.ledger.in_flight(), padding)

    # ------------------------------------------------------------ one batch
    def assemble(self, batch: Batch) -> Assembled | None:
        """Make the finished batch ready to send (module docstring); None when it must
        wait: a row failed its checks (its position is granted again, or skipped), or its
        slot must move and no slot is free."""
        if self.ledger.must_move(batch) and self.ledger.relocate(batch) is None:
            return None
        samples = [pos for pos in batch.positions if pos.done and pos.done.kind == "sample"]
        views = self.places.batch(batch.slot, batch.shape)
        fields = [views[name] for name in self.names if name != "wave"]
        first = batch.slot * self.ledger.rows_per_slot
        finals, failed, moved = {}, [], False
        for j, pos in enumerate(samples):
            assert pos.done is not None and pos.done.entry is not None
            if pos.done.place == first + j and self.waves is None:  # written where it lies
                why = self.check(first + j, pos.done.entry, [f[j] for f in fields])
            else:
                why, moved = self.place(pos, batch, views, j), True
            finals[pos.position] = first + j
            if why:
                failed.append((pos, why))
        if failed:
            self.ledger.moved(batch, finals)
            for pos, why in failed:
                self.drop("torn", f"item {pos.item}: {why}")
                self.ledger.retry(pos)
            return None
        self.complete_rows(batch, samples, views)
        if moved:
            self.ledger.moved(batch, finals)
        return Assembled(batch.slot, len(samples))

    def check(self, k: int, e: p.ReadyEntry, rows: list[np.ndarray]) -> str:
        """A sample at its row k, checked where it lies, as it will be sent: the seqlock
        and its checksum: '' if it is whole, else why not (torn)."""
        g = e.generation
        if self.row_writing[k] != g or self.row_sealed[k] != g:
            return "torn: its place changed after its READY"
        if rows_checksum(r[:n] for r, n in zip(rows, e.lengths, strict=True)) != e.checksum:
            return "torn: its rows changed after its READY"
        return ""

    def place(self, pos: Position, batch: Batch, views: dict[str, np.ndarray], j: int) -> str:
        """Put pos's sample into row j of the batch (a copy unless it was written there),
        then check it: '' if it is whole, else why not (torn)."""
        how = pos.done
        assert how is not None and how.entry is not None
        e, src = how.entry, how.place
        slot, shape, index = self.ledger.where(src)
        dst = [self.waves[j] if name == "wave" else views[name][j] for name in self.names]
        if (slot, index) != (batch.slot, j):
            fields = self.places.fields(slot, shape, index)
            for k, (d, s, n) in enumerate(zip(dst, fields, e.lengths, strict=True)):
                d[:n] = s[:n]
                if n < d.shape[0]:
                    d[n:] = self.pads[k]
            record = self.places.record(batch.slot, j)
            record["writing_generation"] = record["sealed_generation"] = e.generation
            record["lengths"][0, : len(e.lengths)] = e.lengths
        # The seqlock: the producer's fields as they were accepted, after the copy.
        source = self.places.record(slot, index)
        if (
            int(source["writing_generation"][0]) != e.generation
            or int(source["sealed_generation"][0]) != e.generation
        ):
            return "torn: its place changed after its READY"
        if rows_checksum(d[:n] for d, n in zip(dst, e.lengths, strict=True)) != e.checksum:
            return "torn: its rows changed after its READY"
        return ""

    def complete_rows(
        self, batch: Batch, samples: list[Position], views: dict[str, np.ndarray]
    ) -> None:
        """The stager's own columns of the real rows, the padding rows, the stager's mels."""
        n, (rows, frames, text) = len(samples), batch.shape
        entries = [pos.done.entry for pos in samples if pos.done and pos.done.entry]
        lengths = np.array([e.lengths for e in entries], np.int32).reshape(n, len(self.names))
        items = np.array([pos.item for pos in samples], np.int64)
        views["text_lens"][:n] = lengths[:, 0]
        views["items"][:n] = items
        views["position"][:n] = [pos.position for pos in samples]
        views["valid"][:n] = True
        if self.speaker_of is not None:
            views["speaker"][:n] = self.speaker_of[items]
            views["language"][:n] = self.language_of[items]
        else:  # tests build batches without tables
            views["speaker"][:n] = views["language"][:n] = 0
        for k, f in enumerate(self.schema.extras, start=2):
            if f.length == "own":
                views[f.lens_name][:n] = lengths[:, k]
        if self.waves is None:
            views["mel_lens"][:n] = lengths[:, 1]
        else:
            self.wave_lens[:n] = lengths[:, 1]
        if n < rows:
            self.pad_rows(views, n, rows)
        if self.waves is not None:
            self.stager_mels(views, n, rows, frames)
        self.filled += (
            int(views["mel_lens"].sum()),
            rows * frames,
            int(views["text_lens"].sum()),
            rows * text,
        )
        if self.marked is not None:
            for pos, e in zip(samples, entries, strict=True):
                if e.marks & AUDIO:
                    self.marked(pos.item, e.marks)

    def pad_rows(self, views: dict[str, np.ndarray], n: int, rows: int) -> None:
        """Rows n..rows of a part-filled batch: padding, never a real name's ids."""
        views["tokens"][n:] = 0
        views["text_lens"][n:] = 0
        views["items"][n:] = views["position"][n:] = -1
        views["valid"][n:] = False
        views["speaker"][n:], views["language"][n:] = self.padding_ids
        for f in self.schema.extras:
            views[f.name][n:] = f.pad
            if f.length == "own":
                views[f.lens_name][n:] = 0
        if self.waves is None:
            views["mel"][n:] = 0
            views["mel_lens"][n:] = 0
        else:
            self.waves[n:rows] = 0
            self.wave_lens[n:rows] = 0

    def stager_mels(self, views: dict[str, np.ndarray], n: int, rows: int, frames: int) -> None:
        """The whole batch's log-mels from its waveforms, on the stager's device."""
        assert self.waves is not None and self.mel_fn is not None
        lens = self.wave_lens[:rows]
        mel, mel_lens = self.mel_fn(self.waves[:rows, : frames * self.hop], lens)
        views["mel"][:] = mel[:, :frames]
        views["mel_lens"][:] = np.where(lens > 0, np.minimum(mel_lens, frames), 0)

    def forget(self) -> None:
        """Before the rings are unmapped: no view of them may outlive the map."""
        self.places.forget()
        self.row_writing = self.row_sealed = None
