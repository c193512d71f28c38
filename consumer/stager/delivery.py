"""Delivery: finished batches announced to the consumer, skips into the quarantine.

A part of the stager (consumer/stager/stager.py). Each turn it takes the batches the
slot ledger has finished (consumer/stager/ledger.py: every position a sample or a skip;
in plan order when deterministic), has the assembly check and complete each
(consumer/stager/assembly.py: a row that fails sends its position back to be granted
again, and the batch waits), writes one quarantine line per skipped item per run, and
announces the batch with BATCH_READY. When a finite plan is exhausted, END_OF_DATA.

An epoch whose every position was skipped ends the run (NothingDelivered, with
the stages that gave up and one reason): the next epoch holds the same items,
and a run that delivers nothing must not spin through epochs of skips until a
person notices (an epochs: 0 run never ends by itself).
"""

from __future__ import annotations

import collections
import logging

from ringfeed.consumer.stager.assembly import Assembly
from ringfeed.consumer.stager.control import ControlSockets
from ringfeed.consumer.stager.ledger import Ledger
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.quarantine import QuarantineWriter
from ringfeed.consumer.stager.state import Batch, Finished
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

    def count(self, event: Finished, delivered: bool) -> None:
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
    """Announces batches; one consumer at a time (its identity per call)."""

    def __init__(
        self,
        plan: Plan,
        ledger: Ledger,
        assembly: Assembly,
        quarantine: QuarantineWriter,
        index: CorpusIndex,
        net: ControlSockets,
    ) -> None:
        self.plan, self.ledger, self.assembly = plan, ledger, assembly
        self.quarantine, self.index, self.net = quarantine, index, net
        self.batches_sent = 0
        self.skipped: collections.Counter[str] = collections.Counter()  # by stage
        self.end_sent = False
        self.tally = EpochTally(plan.n_items, 0)

    def reset(self, batch_index: int, position: int) -> None:
        """A consumer (re)starts at plan `position`: no batch in the ring, the next one is
        `batch_index`."""
        self.batches_sent, self.end_sent = batch_index, False
        self.tally = EpochTally(self.plan.n_items, position)

    def deliver(self, consumer: bytes) -> None:
        """Announce every batch the ledger has finished and the assembly makes ready."""
        while (batch := self.ledger.complete()) is not None:
            ready = self.assembly.assemble(batch)
            if ready is None:
                break  # a row went back to be granted again, or the batch waits for a slot
            self.announce(consumer, batch, ready.n_valid)
        if self.ledger.exhausted() and not self.end_sent:
            self.net.reply(consumer, p.EndOfData(self.batches_sent))
            self.end_sent = True

    def stats(self) -> DeliveryStats:
        """Its part of the stager's stats."""
        return DeliveryStats(self.batches_sent, dict(self.skipped), self.quarantine.by_stage())

    def announce(self, consumer: bytes, batch: Batch, n_valid: int) -> None:
        """Quarantine lines for its skips, then BATCH_READY. A batch whose items were all
        skipped is not sent, but with several training workers every worker sends one
        batch per global batch (an empty one, n_valid 0): they must stay in step
        (shared/run/share.py)."""
        for pos in batch.positions:
            how = pos.done
            assert how is not None
            if how.kind == "skip":
                self.record_skip(how)
            self.tally.count(how, how.kind != "skip")
        send = bool(n_valid) or self.plan.lockstep
        generation = self.ledger.sent(batch, n_valid, send)
        if not send:
            return
        rows = [pos.position for pos in batch.positions if pos.done and pos.done.kind == "sample"]
        first, last = (
            (rows[0], rows[-1]) if rows else (batch.first, max(batch.first, batch.end - 1))
        )
        epoch_of = self.plan.epoch_of
        # A worker's next position is the global batch's end: the same for every worker and
        # every number of workers (shared/run/share.py), so a checkpoint's cursor resumes
        # any topology at the same global batch. Out of plan order (stager.deterministic
        # false), the oldest batch not yet sent is where a resume starts.
        end = batch.end if self.ledger.deterministic or self.plan.lockstep else self.ledger.cursor
        msg = p.BatchReady(
            batch.slot,
            generation,
            self.batches_sent,
            end,
            epoch_of(last),
            n_valid,
            epoch_of(first),
            *batch.shape,
        )
        self.net.reply(consumer, msg)
        self.batches_sent += 1

    def record_skip(self, how: Finished) -> None:
        """One quarantine line per skipped item per run, whoever gave up on it."""
        self.skipped[how.stage or "?"] += 1
        path = how.path or self.index.path(how.item)
        item_id = self.index.item_id(how.item)
        if self.quarantine.write(item_id, path, how.reason, how.stage, how.cause):
            log.warning("skipped %s (%s): %s", item_id, how.stage, how.reason)
