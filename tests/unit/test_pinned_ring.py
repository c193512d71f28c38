"""The batch ring pinned in place, on the CPU (consumer/client/host_pin.py,
batch_stream.py SlotReads): a slot read by a copy to the device goes back to the
stager only once that copy has ended (a fake event stands for CUDA's); a mapping is
pinned once, its views are covered, and it is unpinned before it is unmapped; a ring
that cannot be pinned is said once."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.consumer.client.batch_stream import SlotReads
from ringfeed.consumer.client.host_pin import HostPin
from tests.support.configs import small
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread

PIN_LOG = "ringfeed.consumer.client.host_pin"


class FakeEvent:
    """A copy's end that a test controls: ended after `queries` queries, or at once
    when the host waits for it (synchronize)."""

    def __init__(self, queries: int = 2) -> None:
        self.left, self.ended, self.waited = queries, False, False

    def query(self) -> bool:
        self.left -= 1
        self.ended = self.ended or self.left <= 0
        return self.ended

    def synchronize(self) -> None:
        self.ended = self.waited = True


def test_a_slot_goes_back_only_once_the_copy_reading_it_has_ended() -> None:
    freed: list[str] = []
    reads = SlotReads(freed.append)
    first, second = FakeEvent(queries=2), FakeEvent(queries=1)
    reads.add("copied out", None)  # place copied it: nothing reads the slot
    reads.add("first", first)
    reads.add("second", second)
    assert freed == ["copied out"]
    reads.release()  # the first copy has not ended: neither goes back (in order)
    assert freed == ["copied out"] and not first.ended
    reads.release()
    assert freed == ["copied out", "first", "second"]
    third = FakeEvent(queries=99)
    reads.add("third", third)
    reads.release(wait=True)  # before the stream waits for anything else
    assert freed[-1] == "third" and third.waited


def test_a_ring_that_cannot_be_pinned_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[tuple[int, int]] = []

    def refuse(address: int, nbytes: int) -> str:
        calls.append((address, nbytes))
        return "cudaHostRegister: out of memory"

    pin = HostPin(refuse, lambda address: "", "cuda:0", on_gpu=True)
    with caplog.at_level(logging.INFO, logger=PIN_LOG):
        pin.pin(4096, 1 << 20)
        pin.pin(8192, 1 << 20)  # the next mapping (a restarted stager, a new pass)
        pin.pin(12288, 0)  # CUDA rejects a zero-byte registration: never asked
    said = [r for r in caplog.records if r.name == PIN_LOG]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "not pinned in place for cuda:0 (cudaHostRegister: out of memory)" in said[0].message
    assert calls == [(4096, 1 << 20), (8192, 1 << 20)] and not pin.pinned
    assert not pin.covers(np.zeros(4))
    pin.unpin(4096)  # nothing was pinned: nothing to undo


def test_a_mapping_is_pinned_once_and_unpinned_before_it_is_unmapped(tmp_path: Path) -> None:
    """A client with a pin: the ring's slots are registered when it maps them, every
    view of a batch lies in the span (an array elsewhere does not), and the span is
    unregistered at close while the ring is still mapped."""
    done: list[str] = []
    spans: list[tuple[int, int]] = []

    def register(address: int, nbytes: int) -> str:
        spans.append((address, nbytes))
        return ""

    pin = HostPin(register, lambda address: done.append(address) or "", "test", on_gpu=False)
    with stager_thread(small(tmp_path, items=8, delay_s=0.0)) as stager:
        with producer_threads(stager.cfg, stager.control, n=1):
            client = BatchClient(stager.cfg, stager.run_id, "pinned", pin=pin)
            client.connect(timeout_s=30)
            ring = client.ring
            batch = client.next(timeout_s=30)
            assert len(spans) == 1 and pin.pinned
            address, nbytes = spans[0]
            assert address % 4096 == 0 and nbytes % 4096 == 0
            assert nbytes >= ring.n_slots * ring.view("mel")[0].nbytes
            assert all(pin.covers(view) for view in batch.arrays.values())
            assert not pin.covers(np.array(batch.arrays["mel"], copy=True))
            client.free(batch)
            unpinned_first: list[bool] = []
            unmap = ring.close

            def close() -> None:
                unpinned_first.append(bool(done))
                unmap()

            ring.close = close
            client.close(finished=False)
    assert done == [address] and unpinned_first == [True] and not pin.pinned
