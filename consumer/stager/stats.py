"""The stager's stats record (shared/stats.py, StagerStats) built from its state.

A pure function of the stager's state: the stager sends ``snapshot(self).to_dict()``
on its stats stream and writes it into stager.json; the inspector
(consumer/tools/inspector.py) and tests read it. Called by the stager loop
every STATS_INTERVAL_S and once at exit.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from shared.ring import SlotState
from shared.stats import (
    MAX_LISTED_PRODUCERS,
    CrashReport,
    Padding,
    ProducerStats,
    StagerStats,
    TrainerReport,
    UnlistedProducers,
)

if TYPE_CHECKING:
    from consumer.stager.stager import Stager
    from consumer.stager.state import Producer


# The stager keeps at most MAX_WORK counters of at most MAX_WORK_KEY characters per
# producer, so the stats message stays under the protocol's header limit (shared/stats.py).
MAX_WORK, MAX_WORK_KEY = 12, 32


def producer_stats(pr: Producer, now: float) -> ProducerStats:
    """One producer's row; now is time.monotonic(), as its last_seen."""
    return ProducerStats(
        name=pr.name,
        pid=pr.pid,
        host=pr.host,
        place=pr.place,
        remote=pr.remote,
        samples=pr.samples,
        grants=len(pr.slots),
        fenced=len(pr.fenced),
        silent_s=round(now - pr.last_seen, 3),
        stalled=pr.stalled,
        work=dict(pr.work),
    )


def listed(stager: Stager) -> tuple[list[Producer], UnlistedProducers]:
    """The producers the stats list (working ones first, then by samples), and a
    summary of the rest."""
    producers = sorted(
        stager.manager.producers.values(), key=lambda pr: (pr.stalled, not pr.slots, -pr.samples)
    )
    shown, rest = producers[:MAX_LISTED_PRODUCERS], producers[MAX_LISTED_PRODUCERS:]
    summary = UnlistedProducers(
        count=len(rest),
        samples=sum(pr.samples for pr in rest),
        grants=sum(len(pr.slots) for pr in rest),
    )
    return shown, summary


def padding_efficiency(filled: Iterable[int]) -> Padding:
    """True / padded mel frames and tokens over every batch sent (None before one)."""
    true_f, pad_f, true_t, pad_t = (int(x) for x in filled)
    return Padding(
        frames=round(true_f / pad_f, 4) if pad_f else None,
        text=round(true_t / pad_t, 4) if pad_t else None,
    )


def snapshot(stager: Stager) -> StagerStats:
    """Everything the inspector and stager.json show."""
    now, manager = time.monotonic(), stager.manager
    shown, unlisted = listed(stager)
    return StagerStats(
        run_id=stager.run_id,
        uptime_s=round(now - stager.t_start, 3),
        n_items=stager.index.n_items,
        cursor=manager.cursor,
        epoch=manager.plan.epoch_of(manager.cursor),
        slots=dict(Counter(SlotState(s.state).name for s in manager.slots)),
        n_slots=stager.cfg.ring.slots,
        batch_slots_ready=stager.builder.in_flight(),
        batches=stager.batches_sent,
        padding_efficiency=padding_efficiency(stager.builder.filled),
        buckets=tuple(tuple(b.shape) for b in stager.buckets),
        counters=dict(manager.counters),
        dropped=dict(stager.dropped),
        bad_metadata_lines=len(stager.index.bad_lines),
        producers=tuple(producer_stats(pr, now) for pr in shown),
        producers_unlisted=unlisted,
        crashes=tuple(CrashReport.from_dict(c) for c in stager.crashes),
        trainer=TrainerReport.from_dict(stager.trainer) if stager.trainer else None,
        consumer_connected=stager.consumer is not None,
        refused_producers=stager.net.refused if stager.net is not None else 0,
        # Where the work can run: the trainer shares the stager's host, on a GPU if any.
        gpus=getattr(stager, "gpus", None),
        features_device=stager.cfg.features.device,
    )
