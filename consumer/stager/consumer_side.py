"""The stager's side facing its one consumer (the trainer, or any batch client).

Mixed into consumer/stager/stager.py's Stager. Only a peer on the ipc socket
that presents the run's consumer secret (shared/run_secret.py) becomes the
consumer, at a plan position inside the plan; anything else is dropped and
counted as "unauthorized". The consumer's messages (BATCH_FREE, STEP_STATS,
HEARTBEAT, BYE) are accepted from that peer only.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable

from consumer.stager.control import is_remote
from shared import protocol as p
from shared.run_secret import FILE as SECRET_FILE

log = logging.getLogger(__name__)


class ConsumerSide:
    """Consumer handlers of the Stager: hello (authenticated), frees, stats, bye."""

    def consumer_refusal(self, ident: bytes, msg: p.ConsumerHello) -> str:
        """'' if this peer may be the consumer from msg.position, else why not."""
        if is_remote(ident):
            return f"consumer hello from {msg.name!r} over tcp: the consumer runs on this host"
        if not hmac.compare_digest(msg.secret.encode(), self.secret.encode()):
            return f"consumer hello from {msg.name!r} without this run's secret ({SECRET_FILE})"
        end = self.manager.plan.end
        if end is not None and msg.position > end:
            return f"consumer hello at position {msg.position}, past the plan's end {end}"
        return ""

    def consumer_hello(self, ident: bytes, msg: p.ConsumerHello) -> None:
        why = self.consumer_refusal(ident, msg)
        if why:
            self.drop("unauthorized", why)
            return
        if ident == self.consumer and (msg.position, msg.batch_index) == self.consumer_at:
            # A hello repeated while we were starting: welcome it again, do not restart.
            self.reply(ident, p.Welcome(self.run_id, self.batches.name, self.index.n_items))
            return
        self.consumer_at = (msg.position, msg.batch_index)
        if self.consumer is not None:
            log.warning(
                "consumer %s replaces the previous one: restarting the plan at %d",
                msg.name,
                msg.position,
            )
        self.consumer = ident
        self.manager.reset(msg.position)
        self.builder.reset()
        self.batches_sent, self.end_sent = msg.batch_index, False
        log.info(
            "consumer %s starts at plan position %d (epoch %d), batch %d",
            msg.name,
            msg.position,
            self.manager.plan.epoch_of(msg.position),
            msg.batch_index,
        )
        self.reply(ident, p.Welcome(self.run_id, self.batches.name, self.index.n_items))

    def on_batch_free(self, msg: p.BatchFree, ident: bytes) -> None:
        if not self.builder.free(msg.slot, msg.generation):
            self.drop("stale", f"BATCH_FREE of slot {msg.slot} generation {msg.generation}")

    def on_step_stats(self, msg: p.StepStats, ident: bytes) -> None:
        t = time.time()
        self.trainer = {"step": msg.step, "step_s": msg.step_s, "wait_s": msg.wait_s,
                        "loss": msg.loss, "rows": msg.rows, "frames": msg.frames,
                        "t": t}  # fmt: skip

    def on_consumer_bye(self, msg: p.Bye, ident: bytes) -> None:
        log.info("consumer finished after %d batches; stopping the run", self.batches_sent)
        self.done = True
        self.reply(ident, p.ByeAck())

    def on_consumer_heartbeat(self, msg: p.Heartbeat, ident: bytes) -> None:
        """A waiting consumer's keep-alive: a new stager answers it with REHELLO instead."""

    CONSUMER_HANDLERS: dict[type, Callable[..., None]] = {
        p.BatchFree: on_batch_free,
        p.StepStats: on_step_stats,
        p.Heartbeat: on_consumer_heartbeat,
        p.Bye: on_consumer_bye,
    }
