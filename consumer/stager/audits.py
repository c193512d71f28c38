"""Audits: what a remote producer says about an item is checked by a local producer.

A part of the stager's intake (consumer/stager/intake.py); the second grant is a twin
of the slot ledger (consumer/stager/ledger/twins.py), written into a spare place. A remote
producer's sample can pass every check the stager has (its rows hash to its checksum,
every value in range) and still be made up: another item's valid mel, or zeros (400 of
400 such rows were batched, issue 35). Only computing the item again tells. So:

- A remote producer's READY is audited with probability ``ring.audit_fraction``, and
  always until ``ring.audit_first`` samples of its peer (a ban key) passed an audit (so
  a peer that lies from the start never has a sample delivered): the sample waits in its
  place, not delivered, and its position is granted again to a local producer (this
  user's own process, running this checkout's code: the one producer the stager trusts).
  The two must agree: lengths and integer fields exactly, floats within AUDIT_TOLERANCE
  (the same code differs by up to ~1e-6 across CPUs; NaN agrees only with NaN, inf with
  the same inf), in every value of the built-in fields but the pitch tracker's: pitch
  and voiced may differ in AUDIT_OUTLIERS of their frames, and only where one side calls
  the frame unvoiced (a borderline frame may be voiced on one CPU and not on another),
  and the user's own fields in AUDIT_OUTLIERS of their values, by any amount (their code
  is the user's). If they do, the remote sample is delivered; if not, the local one is,
  the remote peer gets a strike, and its samples still waiting in the ring are granted
  again, uncharged.
- Every SKIP of a remote producer is audited (an honest one's "longer than its length
  bucket" too; a READY that claims more rows than its place holds is a lie, refused
  whole): an item is quarantined
  only when a local producer cannot use it either; otherwise the local sample is
  delivered and the skipping peer's grant limit halves (a skip may be honest: a file
  missing on that host, so it is not a strike).
- A local producer that cannot use an item a remote one delivered decides nothing (it
  may lack something the other host has): the remote sample is delivered, counted
  inconclusive.
- With stager mels (features.device: stager) a sample's wave field holds its waveform,
  or its clip's log-mel from its host's feature cache (shared/sample/marks.py MEL).
  Where one side is a mel and the other a waveform (one host's cache is warm), they are
  compared in mel space: the waveform's log-mel computed here, on the CPU
  (consumer/stager/numpy_mel.py, one row), against the mel, within AUDIT_TOLERANCE. A
  peer is never struck for having, or lacking, a cache; a wrong mel still differs.

Cost: each audit is one more sample computed on this host, and the audited position
waits for it (at the default 1 %, ~1 % more local work while remote peers deliver). What
audits miss: a liar that behaves until audit_first of its samples passed and lies after
that has each lie checked with probability audit_fraction, so about ring.max_strikes /
audit_fraction of its lies are delivered before it is banned (300 at 1 % and 3 strikes);
and a liar may flip AUDIT_OUTLIERS of a sample's voicing, or change that many values of
a user's field, without failing an audit. Samples of local producers are never audited.
An audit that no local producer answers in time (a lease once one has joined the run,
AUDIT_GRACE_S before: the launcher starts the head host's pool beside the stager) is
given up, its sample delivered unchecked (counted ``audits_unanswered``), and from then
on remote samples are not held until a local producer delivers a sample (one that joins
and never answers must not hold every remote sample a lease): a run whose producers are
all remote is not audited, and waits AUDIT_GRACE_S once to find that out (set
ring.audit_first and ring.audit_fraction to 0 there).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ringfeed.consumer.stager.numpy_mel import NumpyLogMel
from ringfeed.shared.memory.places import Places
from ringfeed.shared.sample.schema import RESERVED

# Floats of a sample and of its audit agree when within this (log-mel units; a made-up
# or zeroed mel differs by ~1 to 10 in nearly every value).
AUDIT_TOLERANCE = 1e-3
# ... in every value of a built-in field, but in the pitch tracker's fields (VOICING) and
# the user's own fields, where this fraction of the values may differ: a pitch value
# only where one side calls the frame unvoiced (0), a user's value by any amount.
AUDIT_OUTLIERS = 0.01
# The fields a pitch tracker decides frame by frame: a borderline frame may be voiced on
# one CPU and not on another.
VOICING = frozenset({"pitch", "voiced"})
# Before any local producer joined the run, how long an audit waits for one, seconds, at
# least (a lease, if longer): a pool started beside the stager joins within 1-3 s here,
# and an attacker that joins first must not have its samples delivered unchecked.
AUDIT_GRACE_S = 5.0
# Peers whose audit counts are remembered (bounded memory).
MAX_AUDITED_PEERS = 4096


class AuditPolicy:
    """Which remote samples are audited. The draw is the system's randomness, so a peer
    cannot tell which of its samples will be checked."""

    def __init__(self, fraction: float, first: int) -> None:
        self.fraction, self.first = fraction, first
        self.rng = random.SystemRandom()
        self.passes: dict[str, int] = {}  # ban key -> its samples that passed an audit

    def due(self, ban: str) -> bool:
        """Is this remote sample of peer `ban` to be audited?"""
        return self.passes.get(ban, 0) < self.first or self.rng.random() < self.fraction

    def passed(self, ban: str) -> None:
        """A sample of peer `ban` passed its audit."""
        n = self.passes.pop(ban, 0)
        self.passes[ban] = n + 1  # re-inserted: the dict's order is by last use
        while len(self.passes) > MAX_AUDITED_PEERS:
            del self.passes[next(iter(self.passes))]


Where = tuple[int, tuple[int, int, int], int]  # a place: (batch slot or -1, shape, index)


class Side(NamedTuple):
    """One sample of an audit: where it lies, its lengths (ring order), and whether its
    wave field holds its clip's cached mel (marks MEL)."""

    at: Where
    lengths: Sequence[int]
    mel: bool = False


def disagreement(places: Places, a: Side, b: Side, audit_mel: NumpyLogMel | None = None) -> str:
    """'' if the samples a (held) and b (the audit's) agree (see the module docstring),
    else where not. audit_mel: the CPU's log-mel, for a waveform against a mel."""
    rows_a = [f[:n] for f, n in zip(places.fields(*a.at), a.lengths, strict=True)]
    rows_b = [f[:n] for f, n in zip(places.fields(*b.at), b.lengths, strict=True)]
    if a.mel != b.mel:  # one host's cache is warm: both in mel space
        if audit_mel is None:  # the intake refuses a mel where producers compute mels
            return "a cached mel against a waveform, and no mel of this stager's to compare"
        k = places.names.index("wave")
        waves = rows_b if a.mel else rows_a
        waves[k] = wave_mel(audit_mel, waves[k]).reshape(-1)
    lengths_a, lengths_b = [len(r) for r in rows_a], [len(r) for r in rows_b]
    if lengths_a != lengths_b:
        return f"lengths {lengths_a} against the audit's {lengths_b}"
    for name, x, y in zip(places.names, rows_a, rows_b, strict=True):
        if x.dtype.kind == "f":  # within the tolerance, or the same inf, or NaN on both
            x64 = x.astype(np.float64)  # sides (the item's fault: the content check's)
            off = ~(
                (np.abs(x64 - y) <= AUDIT_TOLERANCE) | (x64 == y) | (np.isnan(x64) & np.isnan(y))
            )
        else:
            off = x != y
        n_off = int(np.count_nonzero(off))
        if not n_off:
            continue
        if name in VOICING:  # a voicing flip: the frame is unvoiced (0) on one side
            flips_only = not np.any(off & (x != 0) & (y != 0))
            fits = flips_only and n_off <= AUDIT_OUTLIERS * x.size
        else:  # a built-in field is the same code's in every value; a user's may stray
            fits = name not in RESERVED and n_off <= AUDIT_OUTLIERS * x.size
        if not fits:
            return f"{name}: {n_off} of {x.size} values differ"
    return ""


def wave_mel(audit_mel: NumpyLogMel, wave: np.ndarray) -> np.ndarray:
    """A waveform's log-mel float32 [1 + n // hop_length, n_mels], on the CPU."""
    hop, n = audit_mel.definition.hop_length, len(wave)
    padded = np.zeros((1, (n // hop + 1) * hop), np.float32)
    padded[0, :n] = wave
    mel, mel_lens = audit_mel(padded, np.array([n], np.int32))
    return mel[0, : mel_lens[0]]
