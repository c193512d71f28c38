"""A producer's side of its session with the stager, as a state machine.

It owns no socket, reads no clock and does no sample work: the worker
(producer/process/worker.py) tells it what it heard and when, ticks it once a loop turn,
and does what it returns, in order: send a protocol message, NEW_SOCKET (close
the control socket and open another: the HELLO that follows goes out on it), or
:class:`Join` (the stager welcomed us onto that ring). It keeps the grants the
worker fills, oldest first, and the counters the stager is told; ``ending`` says
when and how the process ends. Times are seconds on the worker's monotonic
clock; tests/unit/test_session.py drives it with a fake one.

HELLO and WELCOME. The process says HELLO on a new socket at start, when the
stager says REHELLO (it restarted, or took our grants back: the grants still
queued here are void, counted as taken back, and never written), when no
WELCOME came within ring.lease_s (a lossy link lost the HELLO or the WELCOME), and
when a stager that welcomed it has been silent for ring.lease_s (the stager
answers every HEARTBEAT, so silence means it restarted or the link is gone).
HELLOs that go unanswered while the stager says nothing back off: each waits
twice the one before, from ring.lease_s up to RETRY_MAX_S, so a stager that is
paused or cut off by a partition is asked about once a minute until it answers;
its WELCOME rejoins the same run (the stager re-grants whatever it had granted).
A WELCOME for another number of items than this producer reads is a crash (both
must use the same data.path and config). After a WELCOME it asks for
producers.credits grants; they come as runs (a GRANT names several places of one
batch, shared/wire/grants.py), which the worker fills in order and answers a run at
a time.

Lossy links. An idle producer (welcomed, no grant queued) asks again every
ring.heartbeat_s, which repairs a lost REQUEST or the credit a lost READY
carried: the stager caps credits, so asking twice costs nothing. A HEARTBEAT
goes out every ring.heartbeat_s, not each time the producer runs out of grants
(at full rate that was two more messages a sample); the BYE carries the final
counters.

Orphans and refusals. A producer that has heard nothing from the stager for
producers.orphan_s (6 hours by default: a partition heals, a stager paused for
minutes comes back) since a stager WELCOMEd it exits with EXIT_ORPHANED, whatever
it sends meanwhile: only a message from the stager resets that clock, never its
own HELLO. Only time it ran counts: a loop that did not turn for a lease (the
process was SIGSTOPped, its VM suspended, a sample took that long) says HELLO
again and starts the clock anew, for the stager may be fine and waiting. Before
its first WELCOME it waits for its stager as long as it takes (a stager
measuring a length table may take minutes to bind). A REFUSED from the stager
(another protocol version, another config: the reason says what to change), or
any message in another protocol version, ends it with EXIT_REFUSED. The pools
restart neither (producer/process/pool.py).

Goodbyes: on stop the worker sends BYE and waits up to SHUTDOWN_WAIT_S for
BYE_ACK, because ZeroMQ may drop the last messages of a process that exits
right after sending; it says BYE again every BYE_AGAIN_S meanwhile (a lossy
link loses a BYE or its answer as it loses any message; the stager answers every
BYE, a repeated one too). Correctness never depends on it (leases cover a lost
BYE), but an acknowledged exit frees its grants at once. An orphaned or refused
producer, or one never welcomed on its socket, leaves without a word.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ringfeed.shared.config import Config
from ringfeed.shared.run.process import BYE_AGAIN_S, POOL_ORPHANED, SHUTDOWN_WAIT_S
from ringfeed.shared.wire import protocol as p

log = logging.getLogger(__name__)

# The longest wait between two unanswered HELLOs, seconds (they back off from
# ring.lease_s, doubling).
RETRY_MAX_S = 60.0

# Exit codes of a worker that must not be restarted: its run is over (SHUTDOWN, SIGTERM),
# its stager is gone, or it was refused (by the stager, or by its own start check of the
# configured fields, producer/start_check.py). Any other code, 0 included (a library
# that called sys.exit(0)), is a death the pool restarts.
EXIT_FINISHED, EXIT_ORPHANED, EXIT_REFUSED = 3, 4, 5
ENDINGS = {
    EXIT_FINISHED: "finished",
    EXIT_ORPHANED: "lost its stager (no word for producers.orphan_s)",
    EXIT_REFUSED: "was refused, by the stager or by its start check (the logs say why)",
}


def pool_exit_code(endings: list[int]) -> int:
    """A pool's exit code from the exit codes that ended its workers for good (0: one
    the pool stopped): 2 if the stager refused one (its log says what to change),
    POOL_ORPHANED if each lost its stager (shared/run/process.py), else 0."""
    ended = [code for code in endings if code]
    if EXIT_REFUSED in ended:
        return 2
    return POOL_ORPHANED if ended and all(code == EXIT_ORPHANED for code in ended) else 0


@dataclass(frozen=True)
class Rules:
    """The session's terms, from the config."""

    lease_s: float  # ring.lease_s: HELLO again after this long without WELCOME or word
    heartbeat_s: float  # ring.heartbeat_s: HEARTBEAT, and REQUEST while idle, this often
    orphan_s: float  # producers.orphan_s: no word this long since a WELCOME: exit
    credits: int  # producers.credits: grants asked for in one REQUEST

    @classmethod
    def of(cls, cfg: Config) -> Rules:
        ring, producers = cfg.ring, cfg.producers
        return cls(ring.lease_s, ring.heartbeat_s, producers.orphan_s, producers.credits)


@dataclass(frozen=True)
class NewSocket:
    """Close the control socket and open another (a new identity: the stager sees a new
    peer); drop the slot writer, whose unsent READY entries belong to the old session."""


@dataclass(frozen=True)
class Join:
    """The stager welcomed us: send what the current slot writer holds, then write into
    these rings (the batch ring and the spare ring: producer/process/slot_writer.py), and tell
    the pool this worker joined."""

    ring_name: str
    spares: str


NEW_SOCKET = NewSocket()
# What the worker does, in order: send a protocol message, or one of the two above.
Action = p.Message | NewSocket | Join


class Session:
    """The protocol state of one producer process (see the module docstring).

    hello: this process's HELLO, said again on every new socket; n_items: the items its
    source reads; stages: its source's work counters (Source.work), for HEARTBEAT and BYE.
    """

    def __init__(
        self, hello: p.Hello, n_items: int, rules: Rules, stages: Callable[[], dict[str, int]]
    ) -> None:
        self.hello, self.n_items, self.rules, self.stages = hello, n_items, rules, stages
        self.grants: deque[p.GrantEntry] = deque()  # from GRANTs on the current socket
        self.done = 0  # grants answered with a READY or SKIP entry
        self.taken_back = 0  # grants dropped unwritten: the stager had taken them back
        self.welcomed = False  # by the stager, on the current socket
        self.ever_welcomed = False  # from then on, the orphan clock runs
        self.ending: int | None = None  # ENDINGS' code once the process must end
        # Clocks, seconds, all set by start(): the loop's last turn (a longer gap is a
        # pause), the stager's last word, our last HEARTBEAT, REQUEST and HELLO.
        self.last_turn = self.last_heard = self.last_heartbeat = 0.0
        self.last_request = self.hello_at = 0.0
        self.unanswered = 0  # HELLOs in a row without a WELCOME: how long the next waits
        self.leave_by: float | None = None  # from stop on: how long to wait for BYE_ACK
        self.bye: p.Bye | None = None  # what leave() said, said again until BYE_ACK
        self.bye_at = 0.0  # when it was last said
        self.acked = False  # BYE_ACK heard

    # ------------------------------------------------------------ events
    def start(self, now: float) -> list[Action]:
        """The first HELLO (after the source warmed up: none of that in a lease)."""
        self.last_turn = self.last_heard = self.last_heartbeat = now
        return self._hello_again(now)

    def heard(self, msg: p.Message, now: float) -> list[Action]:
        """A message from the stager: any of them proves it is there."""
        self.last_heard = now
        if self.leave_by is not None:  # stopping: only BYE_ACK still matters
            self.acked = self.acked or isinstance(msg, p.ByeAck)
            return []
        if self.ending is not None:
            return []
        if isinstance(msg, p.Grant):
            self.grants.extend(msg.entries())
        elif isinstance(msg, p.Welcome):
            return self._welcome(msg, now)
        elif isinstance(msg, p.Rehello):
            log.info("the stager asked for HELLO again (it restarted, or its consumer moved)")
            return self._hello_again(now)
        elif isinstance(msg, p.Shutdown):
            log.info("stager says stop (%s)", msg.reason)
            self.ending = EXIT_FINISHED
        elif isinstance(msg, p.Refused):
            self._end(EXIT_REFUSED, f"refused by the stager: {msg.reason}")
        return []

    def heard_other_version(self, exc: p.VersionMismatch) -> None:
        """A message in another protocol version: no HELLO again can fix that."""
        self._end(
            EXIT_REFUSED,
            f"the stager speaks ringfeed protocol version {exc.theirs}, "
            f"this producer version {exc.ours}: run the same ringfeed version on "
            "every host",
        )

    def tick(self, now: float) -> list[Action]:
        """Once a loop turn: a pause, the orphan rule, repairs of a lossy link, the
        HEARTBEAT, a silent stager (the module docstring); once leaving, BYE again every
        BYE_AGAIN_S until its BYE_ACK."""
        if self.leave_by is not None:
            if self.bye is None or self.acked or now - self.bye_at < BYE_AGAIN_S:
                return []
            self.bye_at = now
            return [self.bye]
        if self.ending is not None:
            return []
        paused, self.last_turn = now - self.last_turn, now
        if paused > self.rules.lease_s:  # its silence says nothing about the stager
            log.warning(
                "this producer did not run for %.0f s (stopped, or a sample that "
                "long); saying HELLO again",
                paused,
            )
            self.last_heard = now
            return self._hello_again(now)
        silent = now - self.last_heard
        if self.ever_welcomed and silent > self.rules.orphan_s:
            self._end(EXIT_ORPHANED, f"no word from the stager for {silent:.0f} s (it is gone)")
            return []
        if not self.welcomed and now - self.hello_at > self.retry_s:
            self._log_retry(now - self.hello_at, silent)
            return self._hello_again(now)
        out: list[Action] = []
        if self.welcomed and not self.grants and now - self.last_request >= self.rules.heartbeat_s:
            out.append(p.Request(self.rules.credits))
            self.last_request = now
        if now - self.last_heartbeat >= self.rules.heartbeat_s:
            out.append(p.Heartbeat(self.done, self.work()))
            self.last_heartbeat = now
        if self.welcomed and silent > self.rules.lease_s:
            log.warning("stager silent for %.1f s; saying HELLO again", silent)
            out += self._hello_again(now)
        return out

    def leave(self, now: float) -> list[Action]:
        """At stop: BYE with the final counters if a stager welcomed us on this socket and
        the process ends on good terms; then left() says when to stop waiting for BYE_ACK."""
        if self.welcomed and self.exit_code == EXIT_FINISHED:
            self.leave_by, self.bye_at = now + SHUTDOWN_WAIT_S, now
            self.bye = p.Bye(self.done, self.work())
            return [self.bye]
        self.leave_by = now
        return []

    def left(self, now: float) -> bool:
        """BYE_ACK heard, or SHUTDOWN_WAIT_S passed since leave()."""
        return self.acked or (self.leave_by is not None and now >= self.leave_by)

    # ------------------------------------------------------------ grants
    def take(self) -> p.GrantEntry | None:
        """The oldest grant to fill, or None (none queued, or not welcomed)."""
        return self.grants.popleft() if self.welcomed and self.grants else None

    def take_run(self) -> list[p.GrantEntry]:
        """The oldest run's queued grants (one GRANT's, in order), or [] (none queued, or
        not welcomed): the worker fills them one after another; a local one answers the
        run with one READY, a remote one each sample as it is written (worker.fill_run)."""
        if not self.welcomed or not self.grants:
            return []
        first, run = self.grants.popleft(), []
        run.append(first)
        while self.grants and self.grants[0].generation == first.generation:
            run.append(self.grants.popleft())
        return run

    def filled(self, grant: p.GrantEntry) -> None:
        """Its READY or SKIP entry is out (each also asks for one more grant)."""
        self.done += 1

    def dropped(self, grant: p.GrantEntry) -> None:
        """The stager took this grant back: it re-grants the item; we send nothing."""
        log.info("%s: grant of place %d was taken back; dropped", self.hello.name, grant.place)
        self.taken_back += 1

    # ------------------------------------------------------------ state
    @property
    def exit_code(self) -> int:
        """The process's exit code: its ending, or EXIT_FINISHED (SHUTDOWN, or stopped)."""
        return EXIT_FINISHED if self.ending is None else self.ending

    def work(self) -> dict[str, int]:
        """This process's counters for the stager: its source's stages, grants dropped."""
        counters = {**self.stages(), "taken_back": self.taken_back}
        # Within the protocol's bounds, or the stager drops the whole HEARTBEAT and BYE.
        kept = [(k, v) for k, v in counters.items() if len(k) <= p.MAX_WORK_KEY]
        return dict(kept[: p.MAX_WORK_KEYS])

    @property
    def retry_s(self) -> float:
        """How long the HELLO just sent waits for its WELCOME: ring.lease_s, doubled for
        each unanswered one before it, at most RETRY_MAX_S (and never below a lease);
        just a lease when the stager spoke since (it lives: a WELCOME was lost)."""
        if self.last_heard > self.hello_at:
            return self.rules.lease_s
        backoff = self.rules.lease_s * 2.0 ** min(self.unanswered - 1, 16)
        return max(self.rules.lease_s, min(backoff, RETRY_MAX_S))

    def _log_retry(self, waited_s: float, silent_s: float) -> None:
        """The first few unanswered HELLOs, then every 16th: concise over hours."""
        if self.unanswered <= 4 or self.unanswered % 16 == 0:
            left = f"; exiting in {self.rules.orphan_s - silent_s:.0f} s (producers.orphan_s)"
            log.warning(
                "no WELCOME %.1f s after HELLO; saying HELLO again%s",
                waited_s,
                left if self.ever_welcomed else "",
            )

    def _hello_again(self, now: float) -> list[Action]:
        """HELLO on a new socket; the grants still queued are void (the stager took them
        back), and so are READY entries not yet sent (the worker drops its writer)."""
        self.unanswered += 1
        self.taken_back += len(self.grants)
        self.grants.clear()
        self.welcomed = False
        self.hello_at = now  # not last_heard: our own HELLO proves nothing
        return [NEW_SOCKET, self.hello]

    def _welcome(self, msg: p.Welcome, now: float) -> list[Action]:
        if msg.n_items != self.n_items:
            raise RuntimeError(
                f"the stager plans {msg.n_items} items but this producer reads "
                f"{self.n_items}: both must use the same data.path and config"
            )
        if self.unanswered > 4:
            log.info("the stager answered after %d HELLOs; rejoined", self.unanswered)
        self.welcomed = self.ever_welcomed = True
        self.unanswered = 0
        self.last_request = now
        return [Join(msg.ring_name, msg.spares), p.Request(self.rules.credits)]

    def _end(self, code: int, why: str) -> None:
        """End for good with this exit code (never restarted: producer/process/pool.py)."""
        log.error("%s: %s; exiting", self.hello.name, why)
        self.ending = code
