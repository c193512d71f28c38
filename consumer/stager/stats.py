"""The stager's stats record (consumer/stager/stats_record.py, StagerStats) built from its state.

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

from ringfeed.consumer.stager.stats_record import (
    MAX_LISTED_PRODUCERS,
    Padding,
    ProducerStats,
    StagerStats,
    UnlistedProducers,
)
from ringfeed.shared.memory.ring import SlotState

if TYPE_CHECKING:
    from ringfeed.consumer.stager.stager import Stager
    from ringfeed.consumer.stager.state import Producer


def producer_stats(stager: Stager, pr: Producer, now: float) -> ProducerStats:
    """One producer's row; now is time.monotonic(), as its last_seen."""
    return ProducerStats(
        name=pr.name,
        pid=pr.pid,
        host=pr.host,
        place=pr.place,
        remote=pr.remote,
        samples=pr.samples,
        grants=stager.slots.holding(pr.ident),
        fenced=stager.slots.fences(pr.ident),
        silent_s=round(now - pr.last_seen, 3),
        stalled=pr.stalled,
        work=dict(pr.work),
    )


def listed(stager: Stager) -> tuple[list[Producer], UnlistedProducers]:
    """The producers the stats list (working ones first, then by samples), and a
    summary of the rest."""
    holding = stager.slots.holding
    producers = sorted(
        stager.book.producers.values(),
        key=lambda pr: (pr.stalled, not holding(pr.ident), -pr.samples),
    )
    shown, rest = producers[:MAX_LISTED_PRODUCERS], producers[MAX_LISTED_PRODUCERS:]
    summary = UnlistedProducers(
        count=len(rest),
        samples=sum(pr.samples for pr in rest),
        grants=sum(holding(pr.ident) for pr in rest),
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
    now, manager = time.monotonic(), stager.slots
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
        batches=stager.delivery.batches_sent,
        padding_efficiency=padding_efficiency(stager.builder.filled),
        buckets=tuple(tuple(b.shape) for b in stager.plan.buckets),
        counters=manager.counters
        | {
            "restarts": stager.book.restarts,
            "strikes": stager.book.trust.n_strikes,
            "peers_banned": stager.book.n_banned,
        },
        dropped=dict(stager.drop.counts),
        bad_metadata_lines=len(stager.index.bad_lines),
        producers=tuple(producer_stats(stager, pr, now) for pr in shown),
        producers_unlisted=unlisted,
        crashes=tuple(stager.producers.crashes),
        trainer=stager.consumer.trainer,
        consumer_connected=stager.consumer.ident is not None,
        refused_producers=stager.net.refused,
        # Where the work can run: the trainer shares the stager's host, on a GPU if any.
        gpus=stager.gpus,
        features_device=stager.cfg.features.device,
        lease_s=stager.cfg.ring.lease_s,
    )
