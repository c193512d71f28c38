"""The batch ring pinned in place, on the CPU (consumer/client/host_pin.py,
batch_stream.py SlotReads): a slot read by a copy to the device goes back to the
stager only once that copy has ended (a fake event stands for CUDA's); a mapping is
pinned once, its views are covered, and it is unpinned before it is unmapped; a ring
that cannot be pinned is said once, and the loaders then copy out of the slot as
before. The real registration on a GPU: the `gpu` tests of test_torch_loader.py and
test_jax_loader.py."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from ringfeed.consumer.client import batch_client
from ringfeed.consumer.client.batch_client import BatchClient
from ringfeed.consumer.client.batch_stream import SlotReads
from ringfeed.consumer.client.host_pin import HostPin
from ringfeed.producer.sources import check_synthetic_rows
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


def test_the_stream_frees_each_slot_after_its_copy_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torch loader on the CPU whose copies end at a fake event: every BATCH_FREE
    comes after the event of the copy out of its slot, and every row is its item."""
    torch = pytest.importorskip("torch")
    from ringfeed.torch import RingLoader

    torch.set_num_threads(1)
    events: list[FakeEvent] = []
    freed_after_end: list[bool] = []

    class EventLoader(RingLoader):
        def place(self, arrays):  # the CPU's copy, announced as a copy still reading
            placed, _ = super().place(arrays)
            events.append(FakeEvent(queries=3))
            return placed, events[-1]

    free = BatchClient.free

    def recorded(client: BatchClient, batch) -> None:
        freed_after_end.append(events[len(freed_after_end)].ended)
        free(client, batch)

    monkeypatch.setattr(batch_client.BatchClient, "free", recorded)
    items = []
    with stager_thread(small(tmp_path, items=24, delay_s=0.0)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            for batch in EventLoader(stager.cfg, stager.run_id, pin_ring=False):
                arrays = {k: t.numpy() for k, t in batch.items()}
                items += check_synthetic_rows(arrays, int(arrays["valid"].sum()), stager.cfg)
    assert sorted(items) == list(range(24))
    assert len(freed_after_end) == len(events) > 0 and all(freed_after_end)


def test_the_loaders_on_the_cpu_say_once_that_the_ring_is_not_pinned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two epochs of each loader, closed in between (two streams, two mappings): one
    line each, at INFO (no GPU: nothing lost), and the batches come as before."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    from ringfeed.jax import RingLoader as JaxLoader
    from ringfeed.torch import RingLoader as TorchLoader

    config = small(tmp_path, items=16, delay_s=0.0, stager={"batch_size": 4, "epochs": 2})
    for loader_type, why in (
        (TorchLoader, "the loader's device is the CPU"),
        (JaxLoader, "dma_map"),
    ):
        caplog.clear()
        with stager_thread(config) as stager:
            with producer_threads(stager.cfg, stager.control, n=2):
                loader = loader_type(stager.cfg, stager.run_id)
                with caplog.at_level(logging.INFO, logger=PIN_LOG):
                    rows = [int(b["valid"].sum()) for b in loader]
                    loader.close()  # the next pass maps the ring anew
                    rows += [int(b["valid"].sum()) for b in loader]
                    assert not loader.ring_pinned
        said = [r for r in caplog.records if r.name == PIN_LOG]
        assert len(said) == 1 and said[0].levelno == logging.INFO, said
        assert why in said[0].message and "copied out of its slot first" in said[0].message
        assert sum(rows) == 32
