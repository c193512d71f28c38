"""Log lines about peers, rate-limited per peer and in all: a flood costs the log a few lines.

A part of the stager (consumer/stager/stager.py): the producer desk logs every line
a peer's message causes (a CRASH with its traceback, a join, grants taken back)
through a :class:`PeerLog`. Each peer may cause PEER_BURST lines at once, then
one per PEER_REFILL_S; all peers together TOTAL_BURST, then one per
TOTAL_REFILL_S, so a key that opens many identities is bounded too. A line over
either budget is not written and is counted as a dropped message, reason
"rate-limited" (stager.json, the inspector); once the peer's budget allows
again, one line (its next, or :meth:`PeerLog.summarize`'s) says how many of its
lines were suppressed since. Measured without
it: 100,800 CRASH messages in 10 s grew the stager's log by 1.5 GiB (issue 18).
The strings in a line were cleaned of control characters at decode
(shared/wire/bounds.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ringfeed.consumer.stager.drops import Drops

# Per peer: a crash storm of one honest worker pool still shows every worker's first
# lines; a traceback is at most 16 KiB (shared/wire/bounds.py MAX_STR).
PEER_BURST, PEER_REFILL_S = 5, 10.0
# All peers together: at most ~16 KiB of traceback per TOTAL_REFILL_S once the burst is out.
TOTAL_BURST, TOTAL_REFILL_S = 40, 2.0
# Peers remembered at once (the oldest is forgotten first): memory stays bounded however
# many identities a flood opens; the total budget still holds for forgotten ones.
MAX_PEERS = 4096


@dataclass
class Bucket:
    """A token bucket: `tokens` lines may be written now, one more every refill_s."""

    burst: int
    refill_s: float
    tokens: float
    t: float
    suppressed: int = 0  # lines not written since the last written one

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.t) / self.refill_s)
        self.t = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class PeerLog:
    """Rate-limited log lines about peers; suppressed ones are counted by `drop`."""

    def __init__(
        self, drop: Drops, logger: logging.Logger, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.drop, self.log, self.clock = drop, logger, clock
        self.peers: dict[str, Bucket] = {}
        self.untold: set[str] = set()  # peers with suppressed lines not yet told
        self.total = Bucket(TOTAL_BURST, TOTAL_REFILL_S, TOTAL_BURST, clock())

    def __call__(self, peer: str, level: int, fmt: str, *args: object) -> bool:
        """Log fmt % args about peer (a producer's name) if its budget and the total allow;
        else count it dropped. True if written."""
        now, bucket = self.clock(), self.peers.get(peer)
        if bucket is None:
            if len(self.peers) >= MAX_PEERS:
                self.untold.discard(forgotten := next(iter(self.peers)))
                del self.peers[forgotten]
            bucket = self.peers[peer] = Bucket(PEER_BURST, PEER_REFILL_S, PEER_BURST, now)
        if not (bucket.take(now) and self.total.take(now)):
            bucket.suppressed += 1
            self.untold.add(peer)
            self.drop("rate-limited", f"a log line about {peer}: {fmt.split(':')[0]}")
            return False
        self.log.log(level, fmt, *args)
        if bucket.suppressed:
            self._tell(peer, bucket)
        return True

    def summarize(self) -> None:
        """For each peer with suppressed lines whose budget (and the total) allows a line
        again, say how many. Called every LEASE_CHECK_S (by ProducerDesk.expire)."""
        now = self.clock()
        for peer in list(self.untold):
            bucket = self.peers[peer]
            if bucket.take(now) and self.total.take(now):
                self._tell(peer, bucket)

    def _tell(self, peer: str, bucket: Bucket) -> None:
        self.log.warning(
            "%d log lines about %s were suppressed (over %d per %.0f s)",
            bucket.suppressed,
            peer,
            PEER_BURST,
            PEER_REFILL_S,
        )
        bucket.suppressed = 0
        self.untold.discard(peer)
