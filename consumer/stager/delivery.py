"""Delivery: finished plan positions into batches, and batches announced to the consumer.

A part of the stager (consumer/stager/stager.py). Each turn it pops the
positions that finished, in plan order when deterministic, as many as the
batch being built has room for; a sample is copied in through the intake's
checked copy (a torn one goes back to be granted again), a skip becomes one
quarantine line per item per run. A full batch (or, when the plan cuts batches,
the end of its range of positions) is announced with BATCH_READY; when a finite
plan is exhausted the last partial batch goes out, then END_OF_DATA.

An epoch whose every position was skipped ends the run (NothingDelivered, with
the stages that gave up and one reason): the next epoch holds the same items,
and a run that delivers nothing must not spin through epochs of skips until a
person notices (an epochs: 0 run never ends by itself).
"""

from __future__ import annotations

import collections
import logging

from ringfeed.consumer.stager.batch_builder import BatchBuilder
from ringfeed.consumer.stager.control import ControlSockets
from ringfeed.consumer.stager.intake import Intake
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.quarantine import QuarantineWriter
from ringfeed.consumer.stager.slot_manager import SlotManager
from ringfeed.consumer.stager.state import Event
from ringfeed.shared.corpus.index import CorpusIndex
from ringfeed.shared.run.stats_record import DeliveryStats
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

# Characters of a skip reason quoted when an epoch delivered nothing.
MAX_SHOWN_REASON = 300


class NothingDelivered(RuntimeError):
    """Every position of an epoch was skipped: the run cannot deliver anything."""


class EpochTally:
    """Per epoch: positions resolved, samples delivered, skips by stage (bounded: only
    epochs with positions still to come are kept)."""

    def __init__(self, n_items: int, start: int) -> None:
        self.n_items, self.start = n_items, start
        self.resolved: collections.Counter[int] = collections.Counter()
        self.delivered: collections.Counter[int] = collections.Counter()
        self.stages: dict[int, collections.Counter[str]] = {}
        self.last_reason = ""

    def count(self, event: Event, delivered: bool) -> None:
        """Count a resolved position; NothingDelivered if it ends an epoch of skips."""
        epoch = event.position // self.n_items
        self.resolved[epoch] += 1
        self.delivered[epoch] += delivered
        if not delivered:
            self.stages.setdefault(epoch, collections.Counter())[event.stage or "?"] += 1
            self.last_reason = event.reason[:MAX_SHOWN_REASON]
        first = max(self.start, epoch * self.n_items)  # a resume starts mid-epoch
        if self.resolved[epoch] < (epoch + 1) * self.n_items - first:
            return
        nothing, stages = not self.delivered[epoch], self.stages.pop(epoch, {})
        del self.resolved[epoch], self.delivered[epoch]
        if nothing:
            by_stage = ", ".join(f"{n} at {stage}" for stage, n in stages.most_common())
            raise NothingDelivered(
                f"epoch {epoch}: every item was skipped ({by_stage}), nothing delivered; "
                f"the last reason: {self.last_reason} (all of them: quarantine.jsonl; "
                "`ringfeed validate CONFIG` tells which rule skips how many)"
            )


class Delivery:
    """Builds and announces batches; one consumer at a time (its identity per call)."""

    def __init__(
        self,
        plan: Plan,
        slots: SlotManager,
        builder: BatchBuilder,
        intake: Intake,
        quarantine: QuarantineWriter,
        index: CorpusIndex,
        net: ControlSockets,
    ) -> None:
        self.plan, self.slots, self.builder, self.intake = plan, slots, builder, intake
        self.quarantine, self.index, self.net = quarantine, index, net
        self.batches_sent = 0
        self.skipped: collections.Counter[str] = collections.Counter()  # by stage
        self.first_position = self.last_position = 0  # of the batch being built
        self.batch_end = 0  # the global position after the batch being built (batched)
        self.end_sent = False
        self.tally = EpochTally(plan.n_items, 0)

    def reset(self, batch_index: int, position: int) -> None:
        """A consumer (re)starts at plan `position`: no batch in the ring, the next one is
        `batch_index`."""
        self.builder.reset()
        self.batches_sent, self.end_sent = batch_index, False
        self.tally = EpochTally(self.plan.n_items, position)

    def deliver(self, consumer: bytes) -> None:
        """Move every finished position the batch ring has room for; announce batches."""
        while True:
            room, until = self.builder.room(), None
            if room and self.plan.batched:  # a batch is a range of plan positions
                until = self.begin_batch()
            events = self.slots.pop_events(room, until)
            self.take(events)
            if self.builder.full() or (until is not None and self.slots.cursor >= until):
                # A batch whose items were all skipped is not sent, but with several
                # training workers every worker sends one batch per global batch (an
                # empty one, n_valid 0): they must stay in step (shared/run/share.py).
                if self.builder.rows or self.plan.lockstep:
                    self.announce(consumer)
                continue
            if not events:
                break
        if self.slots.exhausted() and not self.end_sent:
            if self.builder.partial():
                self.announce(consumer)
            if not self.builder.partial():
                self.net.reply(consumer, p.EndOfData(self.batches_sent))
                self.end_sent = True

    def stats(self) -> DeliveryStats:
        """Its part of the stager's stats."""
        return DeliveryStats(self.batches_sent, dict(self.skipped), self.quarantine.by_stage())

    def take(self, events: list[Event]) -> None:
        for i, event in enumerate(events):
            if event.kind == "skip":
                self.record_skip(event)
            elif (bad := self.intake.take(event)) is None:
                if self.builder.rows == 1:
                    self.first_position = event.position
                self.last_position = event.position
            else:
                self.slots.torn(events[i:], bad)  # granted again or skipped; the rest wait
                return
            self.tally.count(event, event.kind != "skip")

    def begin_batch(self) -> int:
        """A batched plan: give the batch starting at the cursor its bucket's shape (this
        worker's rows of it); returns the position after its last."""
        bucket, _, end = self.plan.batch_at(self.slots.cursor)
        if self.builder.rows == 0:
            self.builder.begin(self.plan.buckets[bucket].shape)
        self.batch_end = end
        return end

    def record_skip(self, event: Event) -> None:
        """One quarantine line per skipped item per run, whoever gave up on it."""
        self.skipped[event.stage or "?"] += 1
        path = event.path or self.index.path(event.item)
        item_id = self.index.item_id(event.item)
        if self.quarantine.write(item_id, path, event.reason, event.stage, event.cause):
            log.warning("skipped %s (%s): %s", item_id, event.stage, event.reason)

    def announce(self, consumer: bytes) -> None:
        if not self.builder.rows:  # an empty batch of a share: it ends before the cursor
            self.first_position = self.last_position = self.slots.cursor - 1
        slot, generation, n_valid = self.builder.finish()
        epoch_of = self.plan.epoch_of
        # A worker's next position is the global batch's end, not its own next row: the
        # same for every worker and every number of workers (shared/run/share.py), so a
        # checkpoint's cursor resumes any topology at the same global batch.
        msg = p.BatchReady(
            slot,
            generation,
            self.batches_sent,
            self.batch_end if self.plan.lockstep else self.slots.cursor,
            epoch_of(self.last_position),
            n_valid,
            epoch_of(self.first_position),
            *self.builder.shape,
        )
        self.net.reply(consumer, msg)
        self.batches_sent += 1
