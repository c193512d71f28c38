"""Walking a plan as the stager's delivery cuts it, without processes (tests of
shares and balanced plans)."""

from __future__ import annotations

from ringfeed.consumer.stager.order import PlanOrder
from ringfeed.consumer.stager.plan.plan import Plan
from ringfeed.consumer.stager.state import Event


def batches(plan: Plan, start: int = 0) -> list[tuple[int, list[int]]]:
    """(bucket, positions) of every batch the stager's plan order gives from `start`
    (a consumer's cursor) to the plan's end, as delivery cuts them."""
    order = PlanOrder(plan, deterministic=True)
    order.reset(start)
    out: list[tuple[int, list[int]]] = []
    while (position := order.next_position(window=10**9)) is not None:
        order.granted(position, plan.item_at(position))
        order.finish(Event("sample", position, plan.item_at(position)))
    while not order.exhausted():
        bucket, _, end = plan.batch_at(order.cursor)
        out.append((bucket, [e.position for e in order.pop_events(10**9, until=end)]))
    return out
