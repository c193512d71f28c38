"""diagnose() on hand-built snapshots: one per stage."""

from __future__ import annotations

from typing import Any

import pytest

from consumer.diagnosis import diagnose


def _snap(**over: Any) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "has_stats": True,
        "consumer_connected": True,
        "n_slots": 16,
        "slots": {"FREE": 14, "GRANTED": 2, "READY": 0},
        "batch_slots": 3,
        "batch_ready": 0,
        "batch_size": 4,
        "lease_s": 10.0,
        "oldest_grant_s": 0.1,
        "oldest_ready_s": None,
        "producers": [{"name": "p0", "rate_per_s": 20.0, "grants": 2, "silent_s": 0.1}],
        "trainer": {"step": 5, "step_s": 0.2, "wait_s": 0.19},
    }
    snap.update(over)
    return snap


@pytest.mark.parametrize(
    ("over", "stage"),
    [
        ({"has_stats": False}, "starting"),
        ({"consumer_connected": False}, "no-consumer"),
        ({"oldest_grant_s": 12.0}, "stuck-producer"),
        ({"producers": [{"name": "p0", "stalled": True, "silent_s": 11.0}]}, "stuck-producer"),
        ({}, "producers"),
        ({"slots": {"READY": 14, "GRANTED": 2}, "oldest_ready_s": 2.0}, "stager"),
        (
            {"slots": {"READY": 14, "GRANTED": 2}, "oldest_ready_s": 0.5, "oldest_grant_s": 3.0},
            "producers",
        ),
        (
            {"slots": {"READY": 16}, "batch_ready": 3, "trainer": {"step_s": 0.3, "wait_s": 0.0}},
            "trainer",
        ),
        ({"trainer": {}}, "starting"),
    ],
)
def test_diagnose_stages(over: dict[str, Any], stage: str) -> None:
    d = diagnose(_snap(**over))
    assert d.stage == stage, d
    assert d.evidence and d.advice


def test_producers_evidence_quotes_numbers() -> None:
    d = diagnose(_snap())
    assert "95%" in d.evidence[0] and "20.0 samples/s" in d.evidence[1]
    assert "producers.workers" in d.advice
