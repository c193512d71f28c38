"""Delivery: finished batches announced to the consumer, skips into the quarantine.

A part of the stager (consumer/stager/stager.py). Each turn it takes the batches the
slot ledger has finished (consumer/stager/ledger/face.py next_batch: every position a
sample or a skip; in plan order when deterministic), has the assembly check and complete
each (consumer/stager/assembly.py: rows that fail go to the intake, which decides
who pays, and back to be granted again; the batch waits), writes one quarantine line
per skipped item per run, and announces the batch with BATCH_READY. When a finite plan
is exhausted, END_OF_DATA.

An epoch whose every position was skipped ends the run (NothingDelivered, with
the stages that gave up and one reason): the next epoch holds the same items,
and a run that delivers nothing must not spin through epochs of skips until a
person notices (an epochs: 0 run never ends by itself).
"""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Callable

from ringfeed.consumer.stager.assembly import Assembly
from ringfeed.consumer.stager.control import ControlSockets
from ringfeed.consumer.stager.intake import Intake
from ringfeed.consumer.stager.ledger.face import SAMPLE, BatchOut, Skip, SlotLedger
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.quarantine import QuarantineWriter
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

    def count(self, batch: BatchOut, record: Callable[[int, Skip], None]) -> None:
        """Count a batch's resolved positions, epoch by epoch (a batch may end one), each
        skip recorded first; NothingDelivered if it ends an epoch of skips (the skips of
        a later epoch are not recorded then)."""
        epochs = batch.positions // self.n_items
        first, last = int(epochs[0]), int(epochs[-1])
        for epoch in range(first, last + 1):
            at = epochs == epoch if last > first else slice(None)
            for position in batch.positions[at][batch.kind[at] != SAMPLE].tolist():
                why = batch.skips[position]
                record(position, why)
                self.stages.setdefault(epoch, collections.Counter())[why.stage or "?"] += 1
                self.last_reason = why.reason[:MAX_SHOWN_REASON]
            self.resolved[epoch] += len(batch.positions[at])
            self.delivered[epoch] += int((batch.kind[at] == SAMPLE).sum())
            self.ended(epoch)

    def ended(self, epoch: int) -> None:
        start = max(self.start, epoch * self.n_items)  # a resume starts mid-epoch
        if self.resolved[epoch] < (epoch + 1) * self.n_items - start:
            return
        nothing = not self.delivered[epoch]
        stages = self.stages.pop(epoch, collections.Counter())
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
        *,
        plan: Plan,
        ledger: SlotLedger,
        assembly: Assembly,
        intake: Intake,
        quarantine: QuarantineWriter,
        index: CorpusIndex,
        net: ControlSockets,
        deterministic: bool,
    ) -> None:
        """deterministic: stager.deterministic (batches leave in plan order)."""
        self.plan, self.ledger, self.assembly, self.intake = plan, ledger, assembly, intake
        self.quarantine, self.index, self.net = quarantine, index, net
        self.deterministic = deterministic
        self.batches_sent = 0
        self.skipped: collections.Counter[str] = collections.Counter()  # by stage
        # (item, stage, path) of the skips in the quarantine file: an item skipped again
        # in a later epoch is counted without reading its id and path from the index.
        self.recorded: set[tuple[int, str, str]] = set()
        self.end_sent = False
        self.tally = EpochTally(plan.n_items, 0)

    def reset(self, batch_index: int, position: int) -> None:
        """A consumer (re)starts at plan `position`: no batch in the ring, the next one is
        `batch_index`."""
        self.batches_sent, self.end_sent = batch_index, False
        self.tally = EpochTally(self.plan.n_items, position)

    def deliver(self, consumer: bytes) -> None:
        """Announce every batch the ledger has finished and the assembly makes ready."""
        while (batch := self.ledger.next_batch()) is not None:
            ready = self.assembly.assemble(batch)
            if ready.failed:  # rows go back to be granted again; the batch waits
                self.intake.rows_failed(batch, ready.finals, ready.failed)
                break
            self.announce(consumer, batch, ready.n_valid)
        if not self.end_sent and self.ledger.progress().exhausted:
            self.net.reply(consumer, p.EndOfData(self.batches_sent))
            self.end_sent = True

    def stats(self) -> DeliveryStats:
        """Its part of the stager's stats."""
        return DeliveryStats(self.batches_sent, dict(self.skipped), self.quarantine.by_stage())

    def announce(self, consumer: bytes, batch: BatchOut, n_valid: int) -> None:
        """Quarantine lines for its skips, then BATCH_READY. A batch whose items were all
        skipped is not sent, but with several training workers every worker sends one
        batch per global batch (an empty one, n_valid 0): they must stay in step
        (shared/run/share.py)."""
        if len(batch.positions):
            self.tally.count(batch, functools.partial(self.record_skip, batch))
        send = bool(n_valid) or self.plan.lockstep
        generation = self.ledger.sent(batch, n_valid, send)
        if not send:
            return
        rows = batch.positions[batch.kind == SAMPLE]
        if len(rows):
            first, last = int(rows[0]), int(rows[-1])
        else:
            first, last = batch.first, max(batch.first, batch.end - 1)
        n_items = self.plan.n_items
        # A worker's next position is the global batch's end: the same for every worker and
        # every number of workers (shared/run/share.py), so a checkpoint's cursor resumes
        # any topology at the same global batch. Out of plan order (stager.deterministic
        # false), the oldest batch not yet sent is where a resume starts.
        if self.deterministic or self.plan.lockstep:
            end = batch.end
        else:
            end = self.ledger.progress().cursor
        msg = p.BatchReady(
            batch.slot,
            generation,
            self.batches_sent,
            end,
            last // n_items,
            n_valid,
            first // n_items,
            *batch.shape,
        )
        self.net.reply(consumer, msg)
        self.batches_sent += 1

    def record_skip(self, batch: BatchOut, position: int, why: Skip) -> None:
        """One quarantine line per skipped item per run, whoever gave up on it."""
        self.skipped[why.stage or "?"] += 1
        item = int(batch.items[batch.positions.searchsorted(position)])
        key = (item, why.stage, why.path)
        if key in self.recorded:
            return
        self.recorded.add(key)
        path = why.path or self.index.path(item)
        item_id = self.index.item_id(item)
        if self.quarantine.write(item_id, path, why.reason, why.stage, why.cause):
            log.warning("skipped %s (%s): %s", item_id, why.stage, why.reason)
