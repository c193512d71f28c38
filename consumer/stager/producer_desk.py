"""The stager's desk for producers: their messages in, their grants out.

A part of the stager (consumer/stager/stager.py). One short handler per
message kind, found in a table; READY and SKIP go to the intake. Decisions about
who may join and who pays for a grant taken back are the producer book's
(consumer/stager/producer_book.py); place changes are the slot ledger's.
At the end, :meth:`ProducerDesk.shut_down` tells every producer to stop and
collects their last counters. A HELLO whose config fingerprint is not the
stager's is answered REFUSED with the keys that differ (shared/run/fingerprint.py):
that producer would write samples of another shape or meaning. Each producer that
joins is reported with its HELLO's causes (``on_join``): the stager settles the
items quarantined earlier in the run by the first (consumer/stager/quarantine.py),
and each SKIP's quarantine line records its producer's cause of that stage.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from ringfeed.consumer.stager.control import ControlSockets, is_remote
from ringfeed.consumer.stager.drops import Drops
from ringfeed.consumer.stager.intake import Intake
from ringfeed.consumer.stager.peer_log import PeerLog
from ringfeed.consumer.stager.peers import PeerId, with_claims
from ringfeed.consumer.stager.producer_book import Producer, ProducerBook
from ringfeed.shared.run.fingerprint import config_refusal
from ringfeed.shared.run.process import POLL_S
from ringfeed.shared.run.stats_record import CrashReport, DeskStats
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

# At the end, how long the stager waits for producers' goodbyes (their final counters).
LAST_WORDS_S = 1.0
# Crash reports the stats show: the latest few (each one the stager's log shows).
CRASHES_KEPT = 5


def take_work(producer: Producer, work: dict[str, Any]) -> None:
    """Keep a producer's reported counters, plain ints only (the protocol bounds their
    number and names at decode)."""
    producer.work = {k: v for k, v in work.items() if type(v) is int}


class ProducerDesk:
    """Producer messages: HELLO, REQUEST, READY (to the intake), SKIP, HEARTBEAT, CRASH,
    BYE; and the GRANTs of each turn."""

    def __init__(
        self,
        *,
        book: ProducerBook,
        intake: Intake,
        welcome: p.Welcome,
        net: ControlSockets,
        drop: Drops,
        sample_config: dict[str, str],
        on_join: Callable[[dict[str, str]], object] | None = None,
    ) -> None:
        """welcome: what a producer is told (the sample ring's name, the plan's items);
        sample_config: the stager's config fingerprint, which every HELLO must carry;
        on_join: called with a producer's causes when it joins, before its first grant."""
        self.book, self.intake, self.welcome, self.net, self.drop = book, intake, welcome, net, drop
        self.sample_config, self.on_join = sample_config, on_join
        self.crashes: collections.deque[CrashReport] = collections.deque(maxlen=CRASHES_KEPT)
        # Every line a producer's message causes: a flood of them costs a few lines.
        self.say = PeerLog(drop, log)

    def stats(self) -> DeskStats:
        """Its part of the stager's stats: the latest crashes (CRASHES_KEPT)."""
        return DeskStats(tuple(self.crashes))

    def hello(self, ident: bytes, msg: p.Hello, peer: PeerId) -> None:
        if not 0 < msg.pid < 2**31:
            self.drop("malformed", f"HELLO with pid {msg.pid}")
            return
        if why := config_refusal(self.sample_config, msg.config):
            self.drop("refused-config", f"producer {msg.name!r}: {why}")
            self.net.reply(ident, p.Refused(why))  # it exits: a HELLO again changes nothing
            return
        peer = with_claims(peer, msg.pid, msg.host)
        why = self.book.lasting_refusal(ident, msg.name, peer)
        if why:
            self.drop("refused-peer", f"producer {msg.name!r}: {why}")
            self.net.reply(ident, p.Refused(why))  # it exits: a HELLO again changes nothing
            return
        why = self.book.refusal(ident, msg.name, msg.token, peer)
        if why:
            self.drop("refused-hello", why)  # it says HELLO again after a lease
            return
        # A peer on the tcp socket is remote whatever it says: it never writes our memory.
        remote = msg.remote or is_remote(ident)
        self.intake.salvage(self.book.hello(ident, msg, remote, peer))
        if self.on_join is not None:
            self.on_join(msg.causes)
        where = ", remote" if remote else ""
        self.say(
            msg.name,
            logging.INFO,
            "producer %s joined (pid %d on %s%s)",
            msg.name,
            msg.pid,
            msg.host,
            where,
        )
        self.net.reply(ident, self.welcome)

    def handle(self, producer: Producer, msg: p.Message, payload: list[bytes]) -> None:
        """A known producer's message, by kind; anything else is dropped and counted."""
        handler = self.HANDLERS.get(type(msg))
        if handler is None:
            self.drop("unexpected", f"{type(msg).__name__} from producer {producer.name}")
        else:
            handler(self, msg, producer, payload)

    def on_request(self, msg: p.Request, producer: Producer, payload: list[bytes]) -> None:
        self.book.credit(producer.ident, msg.credits)

    def on_ready(self, msg: p.Ready, producer: Producer, payload: list[bytes]) -> None:
        self.intake.on_ready(msg, producer, payload)

    def on_skip(self, msg: p.Skip, producer: Producer, payload: list[bytes]) -> None:
        self.intake.on_skip(msg, producer)

    def on_heartbeat(self, msg: p.Heartbeat, producer: Producer, payload: list[bytes]) -> None:
        take_work(producer, msg.work)
        self.net.reply(producer.ident, p.Heartbeat(0, {}))

    def on_crash(self, msg: p.Crash, producer: Producer, payload: list[bytes]) -> None:
        """Logged and kept for the stats unless this peer's crashes come too fast (then
        counted "rate-limited"): a worker sends one CRASH before it exits."""
        if self.say(
            producer.name, logging.ERROR, "producer %s crashed:\n%s", msg.name, msg.traceback
        ):
            self.crashes.append(CrashReport(msg.name, msg.traceback[-2000:]))

    def on_bye(self, msg: p.Bye, producer: Producer, payload: list[bytes]) -> None:
        self.book.drop(producer.ident, charge=False)
        self.book.left(producer.ident, producer.name)
        self.net.reply(producer.ident, p.ByeAck())

    HANDLERS: dict[type, Callable[..., None]] = {
        p.Request: on_request,
        p.Ready: on_ready,
        p.Skip: on_skip,
        p.Heartbeat: on_heartbeat,
        p.Crash: on_crash,
        p.Bye: on_bye,
    }

    def grant(self) -> None:
        """Give each producer what its credits allow, one GRANT message per run."""
        for ident, runs in self.book.grant_round().items():
            for run in runs:
                msg = p.Grant.of_run(
                    run.generation,
                    run.slot,
                    run.shape,
                    run.places.tolist(),
                    run.items.tolist(),
                    run.positions.tolist(),
                )
                if not self.net.reply(ident, msg):
                    self.drop("unsent", f"GRANT of {len(run)} places: the peer is gone or full")
                    self.book.unsend(ident, run)

    def expire(self, lease_s: float) -> None:
        expiry = self.book.expire()
        self.intake.salvage(expiry.salvage)
        for name in expiry.names:
            self.say(
                name,
                logging.WARNING,
                "took back grants of %s: no READY within ring.lease_s=%.1f s (or its process died)",
                name,
                lease_s,
            )
        self.book.reap_zombies()
        self.intake.expire_audits(expiry.audits)
        self.say.summarize()

    def shut_down(self, why: str = "run finished") -> None:
        """SHUTDOWN (saying why) to every producer, then read their reports until each
        has said BYE,
        which carries its final counters, or LAST_WORDS_S passed (a dead or cut-off
        producer), so stager.json holds every producer's last counters however short the
        run was. Only reports are acted on now; each BYE is acknowledged."""
        for ident in list(self.book.producers):
            self.net.reply(ident, p.Shutdown(why))
        waiting = set(self.book.producers)
        deadline = time.monotonic() + LAST_WORDS_S
        while waiting and time.monotonic() < deadline:
            for ident, msg, _, _ in self.net.receive(POLL_S):
                producer = self.book.producers.get(ident)
                if producer is None or not isinstance(msg, p.Heartbeat | p.Crash | p.Bye):
                    continue
                if isinstance(msg, p.Bye):
                    take_work(producer, msg.work)
                    waiting.discard(ident)
                    self.net.reply(ident, p.ByeAck())
                else:
                    self.handle(producer, msg, [])
