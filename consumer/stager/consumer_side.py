"""The stager's side facing its one consumer (the trainer, or any batch client).

A part of the stager (consumer/stager/stager.py). Only a peer on the ipc
socket that presents the run's consumer secret (shared/run_secret.py) becomes
the consumer, at a plan position inside the plan; anything else is dropped
and counted as "unauthorized". The consumer's messages (BATCH_FREE,
STEP_STATS, HEARTBEAT, BYE) are accepted from that peer only. A consumer that
resumes with a plan fingerprint (shared/fingerprint.py) other than this stager's
is answered REFUSED naming what changed, unless it asked for a new plan.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable

from consumer.stager.batch_builder import BatchBuilder
from consumer.stager.control import ControlSockets, is_remote
from consumer.stager.delivery import Delivery
from consumer.stager.drops import Drops
from consumer.stager.producer_book import ProducerBook
from shared import protocol as p
from shared.fingerprint import plan_changes
from shared.run_secret import FILE as SECRET_FILE
from shared.stats import TrainerReport

log = logging.getLogger(__name__)


class ConsumerSide:
    """The consumer: who it is, where it started, its last step report, whether it is done."""

    def __init__(
        self,
        secret: str,
        welcome: p.Welcome,
        book: ProducerBook,
        delivery: Delivery,
        builder: BatchBuilder,
        net: ControlSockets,
        drop: Drops,
    ) -> None:
        """welcome: what a consumer is told (the batch ring's name)."""
        self.secret, self.welcome, self.book, self.delivery = secret, welcome, book, delivery
        self.builder, self.net, self.drop = builder, net, drop
        self.ident: bytes | None = None
        self.at = (-1, -1)  # the (position, batch_index) its hello asked for
        self.trainer: TrainerReport | None = None  # its last STEP_STATS, with the time
        self.done = False  # it said BYE: the run is over

    def refusal(self, ident: bytes, msg: p.ConsumerHello) -> str:
        """'' if this peer may be the consumer from msg.position, else why not."""
        if is_remote(ident):
            return f"consumer hello from {msg.name!r} over tcp: the consumer runs on this host"
        if not hmac.compare_digest(msg.secret.encode(), self.secret.encode()):
            return f"consumer hello from {msg.name!r} without this run's secret ({SECRET_FILE})"
        end = self.book.slots.plan.end
        if end is not None and msg.position > end:
            return f"consumer hello at position {msg.position}, past the plan's end {end}"
        return ""

    def hello(self, ident: bytes, msg: p.ConsumerHello) -> None:
        why = self.refusal(ident, msg)
        if why:
            self.drop("unauthorized", why)
            return
        position = self.resume_at(ident, msg)
        if position is None:
            return
        if ident == self.ident and (msg.position, msg.batch_index) == self.at:
            # A hello repeated while we were starting: welcome it again, do not restart.
            self.net.reply(ident, self.welcome)
            return
        if self.ident is not None:
            log.warning("consumer %s replaces the previous one: restarting the plan at %d",
                        msg.name, msg.position)  # fmt: skip
        self.ident, self.at = ident, (msg.position, msg.batch_index)
        self.book.reset(position)
        self.delivery.reset(msg.batch_index)
        epoch = self.book.slots.plan.epoch_of(position)
        log.info("consumer %s starts at plan position %d (epoch %d), batch %d",
                 msg.name, position, epoch, msg.batch_index)  # fmt: skip
        self.net.reply(ident, self.welcome)

    def resume_at(self, ident: bytes, msg: p.ConsumerHello) -> int | None:
        """The plan position this hello starts at: its own, or, when the plan changed and
        it asked for a new plan, the start of epoch msg.new_plan_at; None when refused
        (REFUSED sent: resuming another plan gives items twice or never)."""
        changed = plan_changes(self.welcome.plan, msg.plan) if msg.plan else []
        if not changed:  # the same plan, or a fresh start (or a checkpoint without one)
            return msg.position
        what = ", ".join(changed)
        if msg.new_plan_at:
            position = msg.new_plan_at * self.book.slots.plan.n_items
            log.warning("the plan changed (%s); a new plan starts at epoch %d (position %d)",
                        what, msg.new_plan_at, position)  # fmt: skip
            return position
        why = (f"the plan changed since the consumer's checkpoint ({what}): resuming it would "
               "give items twice or never; restore the old one, or start the trainer with "
               "--new-plan to begin a new plan at the next epoch")  # fmt: skip
        self.drop("refused-plan", why)
        self.net.reply(ident, p.Refused(why))
        return None

    def handle(self, msg: p.Message) -> bool:
        """One message from the consumer; False if it is not one a consumer sends."""
        handler = self.HANDLERS.get(type(msg))
        if handler is not None:
            handler(self, msg)
        return handler is not None

    def on_batch_free(self, msg: p.BatchFree) -> None:
        if not self.builder.free(msg.slot, msg.generation):
            self.drop("stale", f"BATCH_FREE of slot {msg.slot} generation {msg.generation}")

    def on_step_stats(self, msg: p.StepStats) -> None:
        self.trainer = TrainerReport(msg.step, msg.step_s, msg.wait_s, msg.loss, msg.rows,
                                     msg.frames, time.time())  # fmt: skip

    def on_bye(self, msg: p.Bye) -> None:
        log.info("consumer finished after %d batches; stopping the run",
                 self.delivery.batches_sent)  # fmt: skip
        self.done = True
        self.net.reply(self.ident, p.ByeAck())

    def on_heartbeat(self, msg: p.Heartbeat) -> None:
        """A waiting consumer's keep-alive: a new stager answers it with REHELLO instead."""

    HANDLERS: dict[type, Callable[..., None]] = {
        p.BatchFree: on_batch_free,
        p.StepStats: on_step_stats,
        p.Heartbeat: on_heartbeat,
        p.Bye: on_bye,
    }
