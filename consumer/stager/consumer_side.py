"""The stager's side facing its one consumer (the trainer, or any batch client).

A part of the stager (consumer/stager/stager.py). Only a peer on the ipc
socket that presents the run's consumer secret (shared/run/run_secret.py) becomes
the consumer, at a plan position inside the plan; anything else is dropped
and counted as "unauthorized". The consumer's messages (BATCH_FREE,
STEP_STATS, HEARTBEAT, BYE) are accepted from that peer only. A consumer that
resumes with a plan fingerprint (shared/run/fingerprint.py) other than this stager's
is answered REFUSED naming what changed, unless it asked for a new plan.

One consumer at a time: while the consumer holding the run is alive, another
one with the secret is refused (counted "refused-consumer") and told so by a
REFUSED that names the holder, instead of each hello restarting the plan (two
trainers of one run once fought: 51 plan restarts in 20 s, neither finished).
Alive means its process exists (the kernel's pid of its ipc socket, or where the
kernel does not show one the pid its identity carries, shared/run/run_secret.py),
however long it has been busy elsewhere; a holder with no pid known is alive while it
spoke within SILENT_LEASES leases. One consumer means one socket: a second client of
the holder's own process is refused too (two clients in two threads once took the run
from each other 20 times, 1,081 items went to both, issue 35), unless its hello says
`rejoin` (a client made anew where the old one is gone: BatchClient(rejoin=True), the
tf.data adapter's next iterator); the client taken over from is told so by a REFUSED
and stops. Any consumer takes over at once when the holder is dead or silent: a
trainer restarted after SIGKILL resumes.

No consumer, no run: when none has been there for stager.consumer_wait_s (none
came since the stager started, or the holder's process is gone: a user loop that
crashed under `--consumer none`), :meth:`ConsumerSide.check_present` raises
ConsumerGone and the stager ends the run with exit code 6 (STAGER_NO_CONSUMER),
telling its producers why, instead of waiting until someone presses Ctrl-C.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable

from ringfeed.consumer.stager.control import ControlSockets, is_remote
from ringfeed.consumer.stager.delivery import Delivery
from ringfeed.consumer.stager.drops import Drops
from ringfeed.consumer.stager.ledger.face import SlotLedger
from ringfeed.consumer.stager.peers import PeerId
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.producer_book import ProducerBook
from ringfeed.shared.memory.segments import pid_alive
from ringfeed.shared.run.fingerprint import plan_changes
from ringfeed.shared.run.run_secret import FILE as SECRET_FILE
from ringfeed.shared.run.run_secret import consumer_pid
from ringfeed.shared.run.stats_record import ConsumerStats, TrainerReport
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

# A holder whose pid is unknown is gone after this many ring.lease_s without a message
# (a waiting BatchClient says something every HELLO_RETRY_S, 1 s).
SILENT_LEASES = 3


class ConsumerGone(RuntimeError):
    """No consumer for stager.consumer_wait_s: the run ends (the message says why)."""


class ConsumerSide:
    """The consumer: who it is, where it started, its last step report, whether it is done."""

    def __init__(
        self,
        *,
        plan: Plan,
        secret: str,
        welcome: p.Welcome,
        book: ProducerBook,
        delivery: Delivery,
        ledger: SlotLedger,
        net: ControlSockets,
        drop: Drops,
    ) -> None:
        """plan: where a consumer may start; welcome: what a consumer is told (the batch
        ring's name, the plan's fingerprint)."""
        self.plan, self.secret, self.welcome, self.book = plan, secret, welcome, book
        self.delivery, self.ledger, self.net, self.drop = delivery, ledger, net, drop
        self.ident: bytes | None = None
        self.name = ""
        self.pid: int | None = None  # from its identity (None: the identity has none)
        self.last_heard = 0.0  # book.clock() (the stager's run clock) of its last message
        self.at = (-1, -1)  # the (position, batch_index) its hello asked for
        self.trainer: TrainerReport | None = None  # its last STEP_STATS, with the time
        self.done = False  # it said BYE: the run is over
        self.absent_since: float | None = book.clock()  # None while one is there

    def refusal(self, ident: bytes, msg: p.ConsumerHello) -> str:
        """'' if this peer may be the consumer from msg.position, else why not."""
        if is_remote(ident):
            return f"consumer hello from {msg.name!r} over tcp: the consumer runs on this host"
        if not hmac.compare_digest(msg.secret.encode(), self.secret.encode()):
            return f"consumer hello from {msg.name!r} without this run's secret ({SECRET_FILE})"
        end = self.plan.end
        if end is not None and msg.position > end:
            return f"consumer hello at position {msg.position}, past the plan's end {end}"
        return ""

    def stats(self) -> ConsumerStats:
        """Its part of the stager's stats: connected, and the trainer's last report."""
        return ConsumerStats(self.ident is not None, self.trainer)

    def holder(self, ident: bytes, pid: int | None, rejoin: bool) -> str:
        """'' if the peer `ident` (of process `pid`) may be the consumer now, else who
        holds the run; rejoin: it takes over from a live holder of its own process."""
        if self.ident is None or ident == self.ident:
            return ""
        if self.pid is not None:
            alive = pid_alive(self.pid)
        else:
            alive = self.book.clock() - self.last_heard <= SILENT_LEASES * self.book.lease_s
        if not alive or (rejoin and pid is not None and pid == self.pid):
            return ""
        pid_shown = "unknown" if self.pid is None else self.pid
        held = (
            f"run {self.welcome.run_id} is held by consumer {self.name!r} (pid"
            f" {pid_shown}), alive: one consumer at a time"
        )
        if pid is not None and pid == self.pid:
            return (
                f"{held}, a client of this same process: close it and make the new one"
                " with BatchClient(..., rejoin=True) to take the run over"
            )
        return f"{held}; stop that one or wait for it to finish"

    def present(self, now: float) -> bool:
        """Is a consumer there: one holds the run and its process lives (or, its pid
        unknown, it spoke within SILENT_LEASES leases)?"""
        if self.ident is None:
            return False
        if self.pid is not None:
            return pid_alive(self.pid)
        return now - self.last_heard <= SILENT_LEASES * self.book.lease_s

    def check_present(self, now: float, wait_s: float) -> None:
        """ConsumerGone when no consumer has been there for wait_s seconds (0: never)."""
        if self.present(now):
            self.absent_since = None
            return
        if self.absent_since is None:
            self.absent_since = now
            log.warning(
                "consumer %s (pid %s) left without saying goodbye (its script ended, or it "
                "died); the run ends in %.0f s unless a consumer connects "
                "(stager.consumer_wait_s)",
                self.name,
                self.pid,
                wait_s,
            )
        if wait_s and now - self.absent_since > wait_s:
            who = (
                f"consumer {self.name!r} (pid {self.pid}) is gone"
                if self.ident
                else "no consumer connected"
            )
            raise ConsumerGone(
                f"{who} and none came for {wait_s:.0f} s (stager.consumer_wait_s): ending "
                "the run; if a loop of your own consumed it, its log says why it stopped"
            )

    def hello(self, ident: bytes, msg: p.ConsumerHello, peer: PeerId | None = None) -> None:
        """peer: who the kernel says sent it (its pid, 0 where unseen)."""
        why = self.refusal(ident, msg)
        if why:
            self.drop("unauthorized", why)
            return
        pid = peer.pid if peer is not None and peer.pid else consumer_pid(ident)
        held = self.holder(ident, pid, msg.rejoin)
        if held:  # it holds the secret: tell it, or it waits for a WELCOME forever
            self.drop("refused-consumer", f"consumer hello from {msg.name!r}: {held}")
            self.net.reply(ident, p.Refused(held))
            return
        position = self.resume_at(ident, msg)
        if position is None:
            return
        self.last_heard = self.book.clock()
        if ident == self.ident and (msg.position, msg.batch_index) == self.at:
            # A hello repeated while we were starting: welcome it again, do not restart.
            self.net.reply(ident, self.welcome)
            return
        if self.ident is not None and msg.rejoin and pid is not None and pid == self.pid:
            # A loader moving its cursor (load_state_dict), or iterating after a close:
            # the same process, no fault.
            log.info(
                "consumer %s (pid %s) goes on at plan position %d: the same process moved"
                " its cursor",
                msg.name,
                pid,
                msg.position,
            )
        elif self.ident is not None:
            log.warning(
                "consumer %s replaces %s (pid %s, gone, or rejoined by its own"
                " process): restarting the plan at %d",
                msg.name,
                self.name,
                self.pid,
                msg.position,
            )
        if self.ident is not None:
            # Told at once (a client taken over from stops, and never reads on from here).
            self.net.reply(
                self.ident,
                p.Refused(f"consumer {msg.name!r} (pid {pid}) took the run over from this one"),
            )
        self.ident, self.at = ident, (msg.position, msg.batch_index)
        self.name, self.pid = msg.name, pid
        self.book.reset(position)
        self.delivery.reset(msg.batch_index, position)
        # A cursor names the epoch of the last batch it took; the next position may be
        # the next epoch's first: said so, so the two numbers never seem to disagree.
        epoch, done = divmod(position, self.plan.n_items)
        where = (
            f"the start of epoch {epoch}"
            if not done
            else f"epoch {epoch}, {done} of its {self.plan.n_items} positions done"
        )
        log.info(
            "consumer %s starts at plan position %d, batch %d: %s",
            msg.name,
            position,
            msg.batch_index,
            where,
        )
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
            position = msg.new_plan_at * self.plan.n_items
            log.warning(
                "the plan changed (%s); a new plan starts at epoch %d (position %d)",
                what,
                msg.new_plan_at,
                position,
            )
            return position
        why = (
            f"the plan changed since the consumer's checkpoint ({what}): resuming it would "
            "give items twice or never; restore the old one, or relaunch with --new-plan "
            "(`ringfeed run CONFIG --run-id R --new-plan`) to begin a new plan at "
            "the next epoch"
        )
        self.drop("refused-plan", why)
        self.net.reply(ident, p.Refused(why))
        return None

    def handle(self, msg: p.Message) -> bool:
        """One message from the consumer; False if it is not one a consumer sends."""
        handler = self.HANDLERS.get(type(msg))
        if handler is not None:
            self.last_heard = self.book.clock()
            handler(self, msg)
        return handler is not None

    def on_batch_free(self, msg: p.BatchFree) -> None:
        if not self.ledger.freed(msg.slot, msg.generation):
            self.drop("stale", f"BATCH_FREE of slot {msg.slot} generation {msg.generation}")

    def on_step_stats(self, msg: p.StepStats) -> None:
        self.trainer = TrainerReport(
            msg.step, msg.step_s, msg.wait_s, msg.loss, msg.rows, msg.frames, time.time()
        )

    def on_bye(self, msg: p.Bye) -> None:
        """Answered each time: a consumer says BYE again until it hears BYE_ACK."""
        if not self.done:
            log.info(
                "consumer finished after %d batches; stopping the run", self.delivery.batches_sent
            )
        self.done = True
        if self.ident is not None:
            self.net.reply(self.ident, p.ByeAck())

    def on_heartbeat(self, msg: p.Heartbeat) -> None:
        """A waiting consumer's keep-alive: a new stager answers it with REHELLO instead."""

    HANDLERS: dict[type, Callable[..., None]] = {
        p.BatchFree: on_batch_free,
        p.StepStats: on_step_stats,
        p.Heartbeat: on_heartbeat,
        p.Bye: on_bye,
    }
