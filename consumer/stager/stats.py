"""What the stager publishes on its stats stream and writes into stager.json.

A pure function of the stager's state, plain data only: the inspector
(consumer/tools/inspector.py) and tests read it. Called by the stager loop
every STATS_INTERVAL_S and once at exit.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from shared.ring import SlotState

if TYPE_CHECKING:
    from consumer.stager.stager import Stager
    from consumer.stager.state import Producer


# The stats message stays under the protocol's header limit by construction: at most
# this many producers are listed (the busiest; the rest summed in "producers_unlisted"),
# names, hosts and work counters are capped at decode (shared/protocol.py MAX_WORK_KEYS;
# tests/test_trust.py: the worst case).
MAX_LISTED_PRODUCERS = 32


def producer_rows(stager: Stager, producers: list[Producer], now: float) -> list[dict[str, Any]]:
    slots = stager.slots
    return [
        {
            "name": pr.name,
            "pid": pr.pid,
            "host": pr.host,
            "place": pr.place,
            "remote": pr.remote,
            "samples": pr.samples,
            "grants": slots.holding(pr.ident),
            "fenced": slots.fences(pr.ident),
            "silent_s": round(now - pr.last_seen, 3),
            "stalled": pr.stalled,
            "work": pr.work,
        }
        for pr in producers
    ]


def listed(stager: Stager) -> tuple[list[Producer], dict[str, int]]:
    """The producers the stats list (working ones first, then by samples), and a
    summary of the rest."""
    holding = stager.slots.holding
    producers = sorted(
        stager.book.producers.values(),
        key=lambda pr: (pr.stalled, not holding(pr.ident), -pr.samples),
    )
    shown, rest = producers[:MAX_LISTED_PRODUCERS], producers[MAX_LISTED_PRODUCERS:]
    summary = {"count": len(rest), "samples": sum(pr.samples for pr in rest),
               "grants": sum(holding(pr.ident) for pr in rest)}  # fmt: skip
    return shown, summary


def padding_efficiency(filled: Any) -> dict[str, float | None]:
    """True / padded mel frames and tokens over every batch sent (None before one)."""
    true_f, pad_f, true_t, pad_t = (int(x) for x in filled)
    return {
        "frames": round(true_f / pad_f, 4) if pad_f else None,
        "text": round(true_t / pad_t, 4) if pad_t else None,
    }


def snapshot(stager: Stager) -> dict[str, Any]:
    """Everything the inspector and stager.json show."""
    now, manager = time.monotonic(), stager.slots
    shown, unlisted = listed(stager)
    return {
        "run_id": stager.run_id,
        "uptime_s": round(now - stager.t_start, 3),
        "n_items": stager.index.n_items,
        "cursor": manager.cursor,
        "epoch": manager.plan.epoch_of(manager.cursor),
        "slots": dict(Counter(SlotState(s.state).name for s in manager.slots)),
        "n_slots": stager.cfg.ring.slots,
        "batch_slots_ready": stager.builder.in_flight(),
        "batches": stager.delivery.batches_sent,
        "padding_efficiency": padding_efficiency(stager.builder.filled),
        "buckets": [list(b.shape) for b in stager.buckets],
        "counters": manager.counters | {"restarts": stager.book.restarts},
        "dropped": dict(stager.drop.counts),
        "bad_metadata_lines": len(stager.index.bad_lines),
        "producers": producer_rows(stager, shown, now),
        "producers_unlisted": unlisted,
        "crashes": list(stager.producers.crashes),
        "trainer": stager.consumer.trainer,
        "consumer_connected": stager.consumer.ident is not None,
        "refused_producers": stager.net.refused,
        # Where the work can run: the trainer shares the stager's host, on a GPU if any.
        "gpus": stager.gpus,
        "features_device": stager.cfg.features.device,
    }
