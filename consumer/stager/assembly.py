"""A finished batch made ready to send: its rows checked, closed up and completed.

Called by delivery (consumer/stager/delivery.py) for each batch the slot ledger hands
on (consumer/stager/ledger/face.py BatchOut: every position finished). Most samples were written by
their producers straight into their row of the batch slot (docs/design.md#rows-written-once)
and are not copied at all. The others are copied once, into the row they are delivered
in: a sample in a spare place (a second grant, a retry of a fenced row, a remote
producer's audited twin, an unseen producer's, a waveform when the stager computes the
mels), a sample whose row moves up because a position before it was skipped, or every
sample of a batch whose slot a stale producer may still write (it moves to another
slot). Rows past the last sample are padding, written here.

Then every row is checked as it will be sent (docs/design.md#contract-7), in one
read of its bytes: its place's record still carries the accepted generation in both
producer fields after the copy (seqlock), every value is in range
(shared/sample/content.py), and the row hashes to its READY's checksum. A row whose
seqlock or hash fails is torn, a stale writer's doing (a fence lifted too early) or its
producer's; one whose values are out of range was written by a producer that skipped
its own check. Neither is delivered: the intake decides who pays
(consumer/stager/intake.py rows_failed), the position is granted again, and the batch
waits.

The stager's own columns come last, from the ledger and the run's tables, never from a
producer: true lengths, items, plan positions, valid, speaker and language ids (padding
rows: zeros, -1, False, the padding ids of shared/run/id_tables.py). With
``features.device: stager`` the waveforms are copied into a staging array and the whole
batch's log-mels computed at once (consumer/stager/gpu_mel.py), at the batch's one shape
(a cached mel's row there is a waveform of no samples). A row whose wave field holds its
clip's mel from a producer's feature cache (marks MEL) is copied into the batch's mel as
it is; a batch of such rows only calls no mel function at all. The mels computed for a
local producer's rows go to the cache writer (consumer/stager/cache_writer.py), so the
next epoch's rows come as mels.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ringfeed.consumer.stager.cache_writer import CacheWriter
from ringfeed.consumer.stager.gpu_mel import MelInputError
from ringfeed.consumer.stager.ledger.face import SAMPLE, BatchOut
from ringfeed.consumer.stager.numpy_mel import NumpyLogMel
from ringfeed.shared.config import Config
from ringfeed.shared.memory.places import Places
from ringfeed.shared.memory.row_pass import check_fields, check_rows, fold_rows
from ringfeed.shared.run.id_tables import padding_ids
from ringfeed.shared.run.stats_record import BuilderStats, Padding
from ringfeed.shared.sample.content import content_error
from ringfeed.shared.sample.marks import AUDIO, MEL
from ringfeed.shared.sample.schema import SPARE_SHAPE

log = logging.getLogger(__name__)

# Reductions that stay in C (ndarray.any and .sum go through numpy's Python layer: calls
# a batch, benchmarks/stager_calls.py).
ANY, SUM = np.logical_or.reduce, np.add.reduce


@dataclass(frozen=True)
class Assembled:
    """A batch ready to announce (its real rows), or not (failed: row of the batch's
    positions -> why; finals: the row of the batch slot each position's sample lies in
    now, -1 for a skip)."""

    n_valid: int
    finals: np.ndarray
    failed: dict[int, str]


class Assembly:
    """Checks, closes up and completes finished batches (see the module docstring)."""

    def __init__(
        self,
        *,
        cfg: Config,
        places: Places,
        mel_fn: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None,
        ids: tuple[np.ndarray, np.ndarray] | None = None,
        marked: Callable[[int, int], None] | None = None,
        cache_writer: CacheWriter | None = None,
    ) -> None:
        """mel_fn: the stager's batch log-mel (features.device: stager), else None; ids:
        (speaker, language) int32 [n_items] from the run's id tables; marked(item, marks):
        told of each sample sent whose READY carried audio marks (near-silent, clipped:
        consumer/stager/outliers.py lists it); cache_writer: where the mels it computes
        are kept (stager mels, the feature cache on)."""
        self.cfg, self.places = cfg, places
        self.mel_fn, self.marked, self.cache_writer = mel_fn, marked, cache_writer
        self.n_mels = cfg.features.n_mels
        self.vocab = cfg.vocab_size
        self.speaker_of: np.ndarray | None = ids[0] if ids is not None else None
        self.language_of: np.ndarray | None = ids[1] if ids is not None else None
        self.padding_ids = padding_ids(cfg)
        self.schema = cfg.schema
        self.names = places.names
        self.pads = places.pads
        self.hop = cfg.features.hop_length
        self.rows_per_slot = places.rows_per_slot
        # stager mels: waveforms of up to max_frames x hop samples per row.
        wave = mel_fn is not None
        self.waves = np.zeros((cfg.max_batch_rows, cfg.max_samples), np.float32) if wave else None
        self.wave_lens = np.zeros(cfg.max_batch_rows, np.int32)
        self.cached = np.zeros(cfg.max_batch_rows, bool)  # rows that came as mels (MEL)
        self.mels_from_cache = 0  # rows sent as they came: mels from a feature cache
        # Over every batch sent: true mel frames, padded mel frames, true and padded tokens.
        self.filled = np.zeros(4, np.int64)
        self.mel_fallbacks = 0  # the device's mels failed and the CPU's took over
        # The producers' progress fields of every row (column views: the seqlock, per row).
        rows = places.batches.rows if places.batches is not None else None
        self.row_writing = rows["writing_generation"] if rows is not None else None
        self.row_sealed = rows["sealed_generation"] if rows is not None else None

    def stats(self, in_flight: int) -> BuilderStats:
        """Its part of the stager's stats: batches in flight (the ledger's), and true /
        padded mel frames and tokens over every batch sent (None before one)."""
        true_f, pad_f, true_t, pad_t = (int(x) for x in self.filled)
        padding = Padding(
            frames=round(true_f / pad_f, 4) if pad_f else None,
            text=round(true_t / pad_t, 4) if pad_t else None,
        )
        kept = self.cache_writer.counters() if self.cache_writer is not None else {}
        return BuilderStats(
            in_flight,
            padding,
            self.mel_fallbacks,
            self.mels_from_cache,
            kept.get("mels_kept", 0),
            kept.get("mels_not_kept", 0),
        )

    # ------------------------------------------------------------ one batch
    def assemble(self, batch: BatchOut) -> Assembled:
        """Make the finished batch ready to send (module docstring): Assembled with
        nothing failed, or the rows that failed (the batch must wait)."""
        sample = batch.kind == SAMPLE
        finals = np.add.accumulate(sample, dtype=np.int64) - 1
        finals[~sample] = -1
        views = self.places.batch(batch.slot, batch.shape)
        written = (
            sample
            & (batch.src_slot == batch.slot)
            & (batch.src_index == finals)
            & (batch.moved_from < 0)
        )
        if self.waves is not None:
            written[:] = False
        failed = self.check_in_place(batch, written, views) if ANY(written) else {}
        cached = (batch.marks & MEL) != 0
        for row in (sample & ~written).nonzero()[0].tolist():
            if why := self.place(batch, row, int(finals[row]), views, bool(cached[row])):
                failed[row] = why
        n = int(SUM(sample, dtype=np.int64))
        if not failed:
            self.complete_rows(batch, sample, n, views)
        return Assembled(n, finals, failed)

    def check_in_place(
        self, batch: BatchOut, written: np.ndarray, views: dict[str, np.ndarray]
    ) -> dict[int, str]:
        """The samples written where they lie, checked there as they will be sent, each
        row's bytes read once: the seqlock (their records at the accepted generation),
        then their values and checksums (row_pass.py, one call a field for the whole
        batch); row -> why for those that fail."""
        assert self.row_writing is not None and self.row_sealed is not None
        rows = written.nonzero()[0]
        js = batch.src_index[rows]  # its row of the batch: where it was written
        at = batch.slot * self.rows_per_slot + js
        gens = batch.generations[rows] % (1 << 32)
        whole = (self.row_writing[at] == gens) & (self.row_sealed[at] == gens)
        failed = {int(r): "torn: its place changed after its READY" for r in rows[~whole]}
        rows, js = rows[whole], js[whole]
        if not len(rows):
            return failed
        hashes, oks = [], []
        for k, name in enumerate(self.names):
            h, fine = check_rows(views[name], js, batch.lengths[rows, k], name, self.vocab)
            hashes.append(h)
            oks.append(fine)
        ok = np.logical_and.reduce(oks)
        sums = fold_rows(hashes)
        for i in (~ok).nonzero()[0].tolist():  # which value, as content_error says it
            row, j = int(rows[i]), int(js[i])
            n = batch.lengths[row].tolist()
            used = [(name, views[name][j][:m]) for name, m in zip(self.names, n, strict=True)]
            failed[row] = content_error(used, self.vocab) or "values out of range"
        for i in (ok & (sums != batch.checksums[rows])).nonzero()[0].tolist():
            failed[int(rows[i])] = "torn: its rows changed after its READY"
        return failed

    def place(
        self, batch: BatchOut, row: int, j: int, views: dict[str, np.ndarray], cached: bool
    ) -> str:
        """Put a sample into row j of the batch (a copy from where it lies, checked and
        hashed in the same pass; a waveform into the staging array, a cached mel straight
        into the batch's mel), then check its seqlock: '' if it is whole, else why not
        (torn, or values out of range)."""
        slot, index = int(batch.src_slot[row]), int(batch.src_index[row])
        shape = batch.shape if slot >= 0 else SPARE_SHAPE
        g = int(batch.generations[row])
        n = batch.lengths[row].tolist()
        waves = self.waves
        if waves is None:
            dst = [views[name][j] for name in self.names]
        else:  # the batch's mel row, flat, or the staging row
            wave = views["mel"][j].reshape(-1) if cached else waves[j]
            dst = [wave if name == "wave" else views[name][j] for name in self.names]
            if (size := n[self.names.index("wave")]) > len(wave):  # the intake refuses these
                return f"a mel of {size} values where its batch's row holds {len(wave)}"
        # Never its own row: one written where it lies is checked there (check_in_place).
        src = self.places.fields(slot, shape, index)
        used = [s[:m] for s, m in zip(src, n, strict=True)]
        checksum, why = check_fields(self.names, used, self.vocab, dst)
        for k, (d, m) in enumerate(zip(dst, n, strict=True)):
            if m < d.shape[0]:
                d[m:] = self.pads[k]
        record = self.places.record(batch.slot, j)
        record["writing_generation"] = record["sealed_generation"] = g
        record["lengths"][0, : len(n)] = n
        # The seqlock: the producer's fields as they were accepted, after the copy.
        source = self.places.record(slot, index)
        if int(source["writing_generation"][0]) != g % (1 << 32) or (
            int(source["sealed_generation"][0]) != g % (1 << 32)
        ):
            return "torn: its place changed after its READY"
        if why:
            return why
        if checksum != batch.checksums[row]:
            return "torn: its rows changed after its READY"
        return ""

    def complete_rows(
        self, batch: BatchOut, sample: np.ndarray, n: int, views: dict[str, np.ndarray]
    ) -> None:
        """The stager's own columns of the real rows, the padding rows, the stager's mels."""
        rows, frames, text = batch.shape
        lengths = batch.lengths[sample]
        items = batch.items[sample]
        views["text_lens"][:n] = lengths[:, 0]
        views["items"][:n] = items
        views["position"][:n] = batch.positions[sample]
        views["valid"][:n] = True
        if self.speaker_of is not None and self.language_of is not None:
            views["speaker"][:n] = self.speaker_of[items]
            views["language"][:n] = self.language_of[items]
        else:  # tests build batches without tables
            views["speaker"][:n] = views["language"][:n] = 0
        for k, f in enumerate(self.schema.extras, start=2):
            if f.length == "own":
                views[f.lens_name][:n] = lengths[:, k]
        if self.waves is None:
            views["mel_lens"][:n] = lengths[:, 1]
        else:  # a cached mel's row is a waveform of no samples to the device
            cached = (batch.marks[sample] & MEL) != 0
            self.cached[:n], self.cached[n:rows] = cached, False
            self.wave_lens[:n] = np.where(cached, 0, lengths[:, 1])
            views["mel_lens"][:n] = np.where(cached, lengths[:, 1] // self.n_mels, 0)
        if n < rows:
            self.pad_rows(views, n, rows)
        if self.waves is not None:
            self.stager_mels(batch, sample, views, n, rows, frames)
        self.filled += (
            int(SUM(views["mel_lens"])),
            rows * frames,
            int(SUM(views["text_lens"])),
            rows * text,
        )
        if self.marked is not None and ANY((marks := batch.marks[sample] & AUDIO) != 0):
            for item, mark in zip(items.tolist(), marks.tolist(), strict=True):
                if mark:
                    self.marked(item, mark)

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
            views["mel_lens"][n:] = 0

    def stager_mels(
        self,
        batch: BatchOut,
        sample: np.ndarray,
        views: dict[str, np.ndarray],
        n: int,
        rows: int,
        frames: int,
    ) -> None:
        """The batch's log-mels: the cached ones (MEL) are in place already, the rest
        from its waveforms, the whole batch at its shape on the stager's device, or no
        call when every real row came cached; where the device fails (not the batch:
        MelInputError is the stager's own bug, and stops it), on the CPU from then on,
        said once (consumer/stager/numpy_mel.py). What it computed for a local producer's
        row goes to the cache writer."""
        assert self.waves is not None and self.mel_fn is not None
        cached = self.cached[:rows]
        n_cached = int(SUM(cached, dtype=np.int64))
        self.mels_from_cache += n_cached
        if n_cached == n:  # a warm cache: no FFT at all
            views["mel"][n:] = 0
            return
        lens = self.wave_lens[:rows]
        waves = self.waves[:rows, : frames * self.hop]
        try:
            mel, mel_lens = self.mel_fn(waves, lens)
        except MelInputError:
            raise
        except Exception as exc:  # the device's fault (out of memory, lost): not the batch's
            framework = getattr(self.mel_fn, "framework", "the stager's framework")
            log.error(
                "the stager's mels in %s failed (%s: %s): computing them on the CPU from now "
                "on, within the same tolerance; this batch and the rest are delivered, and "
                "the run goes at the CPU's pace (restart the run to use the device again)",
                framework,
                type(exc).__name__,
                exc,
            )
            self.mel_fn = NumpyLogMel(self.cfg)
            self.mel_fallbacks += 1
            mel, mel_lens = self.mel_fn(waves, lens)
        mel_lens = np.where(lens > 0, np.minimum(mel_lens, frames), 0)
        if n_cached:  # their rows hold their mels already
            computed = ~cached
            views["mel"][computed] = mel[computed, :frames]
            views["mel_lens"][computed] = mel_lens[computed]
        else:
            views["mel"][:] = mel[:, :frames]
            views["mel_lens"][:] = mel_lens
        if self.cache_writer is not None:
            spare = (batch.src_slot[sample] < 0) & ~cached[:n]
            places = np.where(spare, batch.src_index[sample], -1)
            self.cache_writer.keep(places, batch.generations[sample], mel[:n], mel_lens[:n])

    def forget(self) -> None:
        """Before the rings are unmapped: no view of them may outlive the map."""
        self.places.forget()
        self.row_writing = self.row_sealed = None
