"""Which plan positions the stager grants next, and in which order finished ones leave.

Pure bookkeeping of plan positions, owned by the slot manager
(consumer/stager/slot_manager.py), which owns the slots. A position is
granted (possibly again, from ``retry``, after its grant was taken back), then
finished as a sample or a skip, then leaves :meth:`PlanOrder.pop_events`
exactly once; positions of other training workers' shares (shared/run/
share.py) are passed over, never granted. Deterministic mode releases
finished positions in plan order (a reorder window); otherwise in any order,
the cursor being the oldest position not yet out. Items known to be bad are
skipped without a grant, and an item never has two grants out at once, but for
the second grant of a backup or an audit (consumer/stager/twins.py), which counts
in ``busy`` and is not in flight: its position is the first grant's.
"""

from __future__ import annotations

import collections
import heapq

from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.state import Event


class PlanOrder:
    def __init__(self, plan: Plan, deterministic: bool) -> None:
        self.plan = plan
        self.deterministic = deterministic
        # item -> (reason, stage): skipped without a grant for the rest of the run.
        self.known_bad: dict[int, tuple[str, str]] = {}
        self.counters = {"delivered": 0, "skipped": 0}
        self.reset(0)

    def reset(self, position: int) -> None:
        """Start at `position`: nothing granted, finished or in flight."""
        position = self.plan.next_owned(position)
        self.next_grant = position
        self.next_event = position
        self.retry: list[int] = []
        self.attempts: dict[int, int] = {}  # position -> charged failed grants
        self.finished: dict[int, Event] = {}
        self.in_flight: dict[int, int] = {}  # position -> its item, while a grant is out
        self.busy: collections.Counter[int] = collections.Counter()  # item -> grants out
        self.taken_from: dict[int, str] = {}  # retry position -> peer it came back from

    @property
    def cursor(self) -> int:
        """The oldest position not yet handed out by pop_events."""
        return self.next_event

    def exhausted(self) -> bool:
        """True once every position of a finite plan has left pop_events."""
        return self.plan.end is not None and self.next_event >= self.plan.end

    def next_position(self, window: int, avoid: str = "") -> int | None:
        """The position to grant next (a retry first), or None: the plan's end, or in
        deterministic mode `window` positions past the cursor. Never a position whose
        item has a grant out (it waits: a bad item costs one attempt, however far
        grants run ahead), nor a retry taken back from the peer `avoid` (it goes to
        another peer, so a peer that never delivers cannot hold it forever)."""
        while True:
            position = self._retry(avoid)
            if position is None:
                position = self.next_grant = self.plan.next_owned(self.next_grant)
                if self.plan.end is not None and position >= self.plan.end:
                    return None
                if self.deterministic and position >= self.next_event + window:
                    return None
                item = self.plan.item_at(position)
                if self.busy[item]:
                    return None  # a dataset smaller than the grants out: wait for it
                self.next_grant += 1
            else:
                item = self.plan.item_at(position)
            if item in self.known_bad:
                reason, stage = self.known_bad[item]
                self.finish(Event("skip", position, item, reason=reason, stage=stage))
                continue
            return position

    def _retry(self, avoid: str) -> int | None:
        """The first retry that may be granted now (see next_position), taken out."""
        if not self.retry:
            return None
        if self._may_retry(self.retry[0], avoid):  # the usual case: O(log n)
            self.taken_from.pop(self.retry[0], None)
            return heapq.heappop(self.retry)
        for position in sorted(self.retry):
            if not self._may_retry(position, avoid):
                continue
            self.retry.remove(position)
            heapq.heapify(self.retry)
            self.taken_from.pop(position, None)
            return position
        return None

    def _may_retry(self, position: int, avoid: str) -> bool:
        if self.busy[self.plan.item_at(position)]:
            return False
        return not avoid or self.taken_from.get(position) != avoid

    def granted(self, position: int, item: int) -> None:
        self.in_flight[position] = item
        self.busy[item] += 1

    def twin(self, item: int) -> None:
        """A second grant of an in-flight position's item (a backup or an audit)."""
        self.busy[item] += 1

    def untwin(self, item: int) -> None:
        """One of two grants of an item is over; the position goes on with the other."""
        self.busy[item] -= 1
        if not self.busy[item]:
            del self.busy[item]

    def unfinish(self, position: int, item: int, peer: str) -> bool:
        """A finished sample still waiting to leave turns out untrustworthy (its peer was
        caught lying): grant it again, uncharged, to another peer. False if it left."""
        event = self.finished.get(position)
        if event is None or event.kind != "sample" or event.item != item:
            return False
        del self.finished[position]
        heapq.heappush(self.retry, position)
        if peer:
            self.taken_from[position] = peer
        return True

    def _landed(self, position: int) -> None:
        """position's grant is over (finished or taken back)."""
        item = self.in_flight.pop(position, None)
        if item is not None:
            self.busy[item] -= 1
            if not self.busy[item]:
                del self.busy[item]

    def taken_back(
        self, position: int, item: int, charged: bool, max_attempts: int, peer: str = ""
    ) -> None:
        """A grant of `position` (held by `peer`) came back unfinished: retry it, or
        skip its item once max_attempts charged grants failed."""
        self._landed(position)
        attempts = self.attempts.get(position, 0) + charged
        self.attempts[position] = attempts
        if attempts < max_attempts:
            heapq.heappush(self.retry, position)
            if peer:
                self.taken_from[position] = peer
            return
        reason = (
            f"lease expired {attempts} times (ring.max_item_attempts): its producers "
            "died or stalled on this input; check it or raise ring.lease_s"
        )
        self.known_bad[item] = (reason, "lease")
        self.finish(Event("skip", position, item, reason=reason, stage="lease"))

    def finish(self, event: Event) -> None:
        self._landed(event.position)
        self.attempts.pop(event.position, None)
        self.finished[event.position] = event

    def unpop(self, events: list[Event]) -> None:
        """Put events just returned by pop_events back (the first one's sample failed the
        stager's check): its position is then taken back, the others leave again later."""
        for event in events:
            self.finished[event.position] = event
            self.counters["delivered" if event.kind == "sample" else "skipped"] -= 1
        self.finished.pop(events[0].position)
        self.next_event = min(self.next_event, *(e.position for e in events))

    def pop_events(self, max_samples: int, until: int | None = None) -> list[Event]:
        """Finished positions, in plan order when deterministic, at most max_samples
        of kind 'sample' (the caller's room in the batch it is building), and none at
        or past `until` (the end of that batch, with length buckets)."""
        out: list[Event] = []
        if self.deterministic:
            while self.next_event in self.finished and (until is None or self.next_event < until):
                if self.finished[self.next_event].kind == "sample" and max_samples <= 0:
                    break
                event = self.finished.pop(self.next_event)
                max_samples -= event.kind == "sample"
                out.append(event)
                self.next_event = self.plan.next_owned(self.next_event + 1)
        else:
            for position in sorted(self.finished):
                if self.finished[position].kind == "sample" and max_samples <= 0:
                    continue
                event = self.finished.pop(position)
                max_samples -= event.kind == "sample"
                out.append(event)
            oldest = min([*self.in_flight, *self.retry, self.next_grant, *self.finished])
            self.next_event = self.plan.next_owned(oldest)
        for event in out:
            self.counters["delivered" if event.kind == "sample" else "skipped"] += 1
        return out
