"""Fills batch-ring slots from sample-ring slots, in the stager.

The batch ring has stager.batch_slots slots (3: triple buffering): one the
stager fills, one the trainer copies to its device, one ready in between. A
batch slot is FREE, FILLING (rows being copied in), or SENT (announced to the
trainer, waiting for its BATCH_FREE). Every batch says which rows are real and
where each sits in the plan: ``valid`` is True for its real rows, ``position`` is
each row's plan position and ``items`` its item. Rows past n_valid (a part-filled
batch: an epoch's or a plan's last, a bucket's leftovers) hold zeros, lengths 0,
item and position -1, valid False, and the reserved padding ids of the speaker and
language tables (shared/run/id_tables.py padding_ids), never a real name's.

With ``features.device: stager`` the rows hold waveforms in a host staging
array and :meth:`BatchBuilder.finish` computes the whole batch's log-mels at
once (consumer/stager/gpu_mel.py) on the stager's device, then writes them into the
batch slot.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ringfeed.shared.config import Config
from ringfeed.shared.memory.batch_ring import BatchState, batch_views
from ringfeed.shared.memory.ring import Ring
from ringfeed.shared.run.id_tables import padding_ids
from ringfeed.shared.run.stats_record import BuilderStats, Padding


class BatchBuilder:
    """Owns the batch ring's free list; called only from the stager loop.

    Each batch has a shape (rows, frames, text): the fixed one (stager.batch_size,
    features.max_frames, text.max_text_len), or its length bucket's, set with
    :meth:`begin` before its first row. Rows are written into the slot's flat
    fields through shared.memory.ring.batch_views, the layout the client reads back."""

    def __init__(
        self,
        cfg: Config,
        batches: Ring,
        mel_fn: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None,
        ids: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """ids: (speaker, language) int32 [n_items] from the run's id tables
        (shared/run/id_tables.py): each row's ids come from its item, not from a producer."""
        self.cfg = cfg
        self.speaker_of, self.language_of = ids if ids is not None else (None, None)
        self.padding_ids = padding_ids(cfg)
        self.ring = batches
        self.mel_fn = mel_fn
        # The optional fields (shared/sample/schema.py), copied after tokens and mel.
        self.extras = cfg.schema.extras
        self.hop = cfg.features.hop_length
        self.shape = (cfg.stager.batch_size, cfg.features.max_frames, cfg.text.max_text_len)
        self.state = [BatchState.FREE] * batches.n_slots
        self.generation = [0] * batches.n_slots
        self.current: int | None = None
        self.view: dict[str, np.ndarray] = {}
        self.rows = 0
        # stager mels: waveforms of up to the batch's frames x hop samples per row.
        cap = batches.view("mel").shape[1] * self.hop if mel_fn is not None else 0
        self.wave_buf = np.zeros(cap, np.float32)
        self.wave_lens = np.zeros(cfg.max_batch_rows, np.int32)
        self.waves = None
        # Over every batch sent: true mel frames, padded mel frames, true and padded tokens.
        self.filled = np.zeros(4, np.int64)

    def reset(self) -> None:
        """Forget every batch (a consumer restarted): all slots free, generations bumped."""
        for k in range(len(self.state)):
            self.state[k] = BatchState.FREE
            self.generation[k] += 1
            self.ring.slots[k]["state"] = BatchState.FREE
        self.current, self.rows = None, 0

    def begin(self, shape: tuple[int, int, int]) -> None:
        """The shape (rows, frames, text) of the batch about to start (rows == 0)."""
        assert self.rows == 0
        self.shape = shape
        self._bind()

    def _bind(self) -> None:
        if self.current is None:
            return
        rows, frames, text = self.shape
        slot = {name: self.ring.view(name)[self.current] for name in self.ring.fields}
        self.view = batch_views(slot, rows, frames, text, self.cfg.schema)
        if self.mel_fn is not None:
            self.waves = self.wave_buf[: rows * frames * self.hop].reshape(rows, -1)

    def room(self) -> int:
        """Rows that can be added now (0 when every batch slot is taken)."""
        if self.current is None:
            free = [k for k, s in enumerate(self.state) if s == BatchState.FREE]
            if not free:
                return 0
            self.current = free[0]
            self.state[self.current] = BatchState.FILLING
            self.rows = 0
            self._bind()
        return self.shape[0] - self.rows

    def in_flight(self) -> int:
        """Batches announced and not yet freed by the consumer."""
        return sum(s == BatchState.SENT for s in self.state)

    def stats(self) -> BuilderStats:
        """Its part of the stager's stats: batches in flight, and true / padded mel
        frames and tokens over every batch sent (None before one)."""
        true_f, pad_f, true_t, pad_t = (int(x) for x in self.filled)
        padding = Padding(
            frames=round(true_f / pad_f, 4) if pad_f else None,
            text=round(true_t / pad_t, 4) if pad_t else None,
        )
        return BuilderStats(self.in_flight(), padding)

    def add(
        self, samples: Ring, slot: int, item: int, lengths: list[int], position: int
    ) -> list[np.ndarray]:
        """Copy the used rows of sample slot `slot` (item `item` at plan `position`) into
        the next row, zeros after them (room() must be > 0). Returns the copies, in
        sample-field order, for the stager's check; :meth:`drop_last` undoes the row if
        that check fails."""
        row, view = self.rows, self.view
        assert self.current is not None and row < self.shape[0]
        n_text, n = lengths[0], lengths[1]
        tokens = view["tokens"][row]
        tokens[:n_text] = samples.view("tokens")[slot][:n_text]
        tokens[n_text:] = 0
        view["text_lens"][row], view["items"][row] = n_text, item
        view["position"][row], view["valid"][row] = position, True
        known = self.speaker_of is not None  # tests build batches without tables
        view["speaker"][row] = self.speaker_of[item] if known else 0
        view["language"][row] = self.language_of[item] if known else 0
        if self.waves is None:
            frames = view["mel"][row]
            frames[:n] = samples.view("mel")[slot][:n]
            view["mel_lens"][row] = n
        else:
            frames = self.waves[row]
            frames[:n] = samples.view("wave")[slot][:n]
            self.wave_lens[row] = n
        frames[n:] = 0
        self.rows += 1
        copies = [tokens[:n_text], frames[:n]]  # sample-field order: tokens, mel or wave, ...
        if self.extras:
            self._add_extras(samples, slot, row, lengths, copies)
        return copies

    def _add_extras(
        self, samples: Ring, slot: int, row: int, lengths: list[int], copies: list[np.ndarray]
    ) -> None:
        """Copy the optional fields' used rows into `row`, their pad value after them;
        append the copies to `copies` (sample-field order)."""
        view = self.view
        for f, m in zip(self.extras, lengths[2:], strict=True):
            dst, src = view[f.name][row], samples.view(f.name)[slot]
            dst[:m] = src[:m]
            dst[m:] = f.pad
            copies.append(dst[:m])
            if f.length == "own":
                view[f.lens_name][row] = m

    def drop_last(self) -> None:
        """Forget the row just added (its sample failed the stager's check)."""
        assert self.rows > 0
        self.rows -= 1

    def full(self) -> bool:
        return self.current is not None and self.rows == self.shape[0]

    def partial(self) -> bool:
        return self.current is not None and 0 < self.rows < self.shape[0]

    def finish(self) -> tuple[int, int, int]:
        """Close the current batch: pad, compute stager mels; returns (slot, gen, n_valid)."""
        k, n, view = self.current, self.rows, self.view
        assert k is not None
        if n < self.shape[0]:
            view["tokens"][n:] = 0
            view["text_lens"][n:] = 0
            view["items"][n:] = view["position"][n:] = -1
            view["valid"][n:] = False
            view["speaker"][n:], view["language"][n:] = self.padding_ids
            for f in self.extras:
                view[f.name][n:] = f.pad
                if f.length == "own":
                    view[f.lens_name][n:] = 0
            if self.waves is None:
                view["mel"][n:] = 0
                view["mel_lens"][n:] = 0
            else:
                self.waves[n:] = 0
                self.wave_lens[n : self.shape[0]] = 0
        if self.waves is not None:
            lens = self.wave_lens[: self.shape[0]]
            mel, mel_lens = self.mel_fn(self.waves, lens)
            view["mel"][:] = mel[:, : self.shape[1]]
            view["mel_lens"][:] = np.where(lens > 0, np.minimum(mel_lens, self.shape[1]), 0)
        rows, frames, text = self.shape
        self.filled += (int(view["mel_lens"].sum()), rows * frames,
                        int(view["text_lens"].sum()), rows * text)  # fmt: skip
        self.generation[k] += 1
        self.state[k] = BatchState.SENT
        header = self.ring.slots[k]
        header["state"], header["generation"], header["lengths"][0] = (
            BatchState.SENT,
            self.generation[k],
            n,
        )
        self.current, self.rows = None, 0
        return k, self.generation[k], n

    def free(self, slot: int, generation: int) -> bool:
        """The trainer copied batch slot `slot`; False for a stale or bogus release."""
        if not 0 <= slot < len(self.state) or self.generation[slot] != generation:
            return False
        if self.state[slot] != BatchState.SENT:
            return False
        self.state[slot] = BatchState.FREE
        self.ring.slots[slot]["state"] = BatchState.FREE
        return True
