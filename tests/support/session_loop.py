"""A producer's session driven on a fake clock as the worker's loop drives it: the
Loop and the stagers of tests/unit/test_session.py and tests/unit/test_session_backoff.py."""

from __future__ import annotations

from collections.abc import Callable

from ringfeed.producer.process.session import NEW_SOCKET, Action, Join, Rules, Session
from ringfeed.shared.wire import protocol as p

N_ITEMS = 8
RULES = Rules(lease_s=10.0, heartbeat_s=1.0, orphan_s=30.0, credits=4)
HELLO = p.Hello("w0", 1234, "host", False, "token", "", {"features.n_mels": "ab12"})
WELCOME = p.Welcome("run", "ring", N_ITEMS, {}, "spares")
STAGES = {"decoded": 5, "mels": 5}
# One turn of the worker's loop, seconds: about its POLL_S (0.05 s), and exact in binary,
# so that the fake clock never drifts off the rules' boundaries.
TURN_S = 2**-5
# A stager: what it answers to each thing the producer says.
Stager = Callable[[Action], list[p.Message]]


def grants(*slots: int) -> p.Grant:
    return p.Grant.of([p.GrantEntry(s, 1, s % N_ITEMS, s) for s in slots])


def answers_heartbeats(action: Action) -> list[p.Message]:
    """A stager that knows the producer: it answers each HEARTBEAT."""
    return [p.Heartbeat(0, {})] if isinstance(action, p.Heartbeat) else []


def never_heard_of_it(action: Action) -> list[p.Message]:
    """A stager that lost the producer's HELLO: any message of it gets REHELLO."""
    return [p.Rehello()] if isinstance(action, p.Heartbeat) else []


class Loop:
    """A session as the worker drives it, on a fake monotonic clock; `said` keeps
    (time, action) for everything the session told the worker to do, and the stager of
    the current run() hears it at once."""

    def __init__(self, rules: Rules = RULES) -> None:
        self.now = 1000.0
        self.session = Session(HELLO, N_ITEMS, rules, lambda: dict(STAGES))
        self.said: list[tuple[float, Action]] = []
        self.stager: Stager | None = None
        self.do(self.session.start(self.now))

    def do(self, actions: list[Action]) -> list[Action]:
        self.said += [(self.now, a) for a in actions]
        for action in actions:
            for reply in self.stager(action) if self.stager else []:
                self.hear(reply)
        return actions

    def hear(self, msg: p.Message) -> list[Action]:
        return self.do(self.session.heard(msg, self.now))

    def welcomed(self) -> Loop:
        assert self.hear(WELCOME) == [Join("ring", "spares"), p.Request(RULES.credits)]
        return self

    def run(self, seconds: float, stager: Stager | None = None) -> None:
        """Turn the loop for `seconds`, a tick every TURN_S; the stager answers what
        the session says (None: it is silent)."""
        end, self.stager = self.now + seconds, stager
        try:
            while self.now < end and self.session.ending is None:
                self.now += TURN_S
                self.do(self.session.tick(self.now))
        finally:
            self.stager = None

    def times(self, kind: type, since: float = 0.0) -> list[float]:
        return [t for t, a in self.said if isinstance(a, kind) and t > since]

    def hellos(self, since: float = 0.0) -> list[float]:
        """When it said HELLO, each time on a new socket."""
        pairs = zip(self.said, self.said[1:], strict=False)
        found = [t for (t, a), (_, b) in pairs if a is NEW_SOCKET and b == HELLO]
        assert len(found) == len(self.times(p.Hello)) == len(self.times(type(NEW_SOCKET)))
        return [t for t in found if t > since]
