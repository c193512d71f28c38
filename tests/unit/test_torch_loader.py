"""ringfeed.torch.RingLoader against the real stager in this process (real sockets and
shared memory, honest producer threads): every row of every batch is its item, bucket
shapes arrive as they are, the cursor resumes the plan exactly, a device that does not
exist and a cursor of another plan are refused with what to change. (Killed consumers,
ranks and the torch trainer: tests/process/test_torch_e2e.py.)"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.sources import check_synthetic_rows
from tests.support.configs import small
from tests.support.polling import wait_for
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread

torch = pytest.importorskip("torch")

from ringfeed.torch import PlanMismatch, RingLoader  # noqa: E402

torch.set_num_threads(1)

N = 48
# LJSpeech-shaped lengths in three length buckets (tests/support/configs.py BUCKETS).
BUCKETED = {
    "data": {"synthetic_lengths": "ljspeech"},
    "features": {"max_frames": 32},
    "stager": {"batch_size": 4, "buckets": [16, 24, 32]},
}


def config(tmp_path: Path, **over: dict) -> Path:
    return small(tmp_path, items=N, delay_s=0.0, **(BUCKETED | over))


def take(loader: RingLoader, n: int | None = None) -> list[dict[str, np.ndarray]]:
    """n batches (None: to the plan's end) as numpy, every row checked against its item."""
    batches = []
    for batch in loader:
        arrays = {name: t.numpy().copy() for name, t in batch.items()}
        check_synthetic_rows(arrays, int(arrays["valid"].sum()), loader.cfg)
        batches.append(arrays)
        if n is not None and len(batches) == n:
            break
    return batches


def summary(batches: list[dict[str, np.ndarray]]) -> list[tuple]:
    """Each batch as (shape of its mel, its items, its positions)."""
    return [(b["mel"].shape, b["items"].tolist(), b["position"].tolist()) for b in batches]


def test_every_row_arrives_as_a_tensor_of_its_item_in_its_buckets_shape(tmp_path: Path) -> None:
    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id, device="cpu")
            first = next(iter(loader))
            batches = [{k: t.numpy().copy() for k, t in first.items()}, *take(loader)]
        assert stager.ended() == 0, "the plan's end should have said BYE and ended the run"
        assert next(loader, None) is None, "once the plan ended, the loader stays exhausted"
    assert set(first) == set(stager.cfg.schema.batch_specs(4, True)) | {"epoch"}
    assert first["valid"].dtype == torch.bool and first["position"].dtype == torch.int64
    assert first["mel"].dtype == torch.float32 and first["tokens"].dtype == torch.int32
    frames = {b["mel"].shape[1] for b in batches}
    assert len(frames) > 1 and frames <= {16, 24, 32}, frames
    items = sorted(i for b in batches for i in b["items"][b["valid"]].tolist())
    assert items == list(range(N)), "each item exactly once"
    for b in batches:  # the row mask, positions and epochs: padding rows say -1
        assert (b["position"][~b["valid"]] == -1).all() and (b["position"][b["valid"]] >= 0).all()
        assert (b["epoch"] == np.where(b["valid"], b["position"] // N, -1)).all()


def test_state_dict_resumes_the_plan_exactly_where_it_stopped(tmp_path: Path) -> None:
    """An uninterrupted loader, and one stopped after 3 batches whose state_dict a new
    loader (a new process would do the same) loads: the same batches, shapes and rows."""
    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            whole = summary(take(RingLoader(stager.cfg, stager.run_id)))
    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            first = RingLoader(stager.cfg, stager.run_id)
            head = summary(take(first, 3))
            state = first.state_dict()
            first.close()  # no BYE: the run waits for its next consumer
            resumed = RingLoader(stager.cfg, stager.run_id)
            resumed.load_state_dict(state)
            tail = summary(take(resumed))
    assert state["position"] == max(head[-1][2]) + 1 and state["batch_index"] == 3
    assert set(state["plan"]) >= {"index", "seed", "buckets", "lengths"}
    assert head + tail == whole


def test_a_device_that_does_not_exist_is_refused_naming_those_that_do(tmp_path: Path) -> None:
    cfg = small(tmp_path)
    with pytest.raises(ValueError) as missing:
        RingLoader(cfg, "nowhere", device=f"cuda:{torch.cuda.device_count() + 3}")
    text = str(missing.value)
    assert f"cuda:{torch.cuda.device_count() + 3}" in text and "does not exist" in text
    assert "cpu" in text.split("sees", 1)[1]
    with pytest.raises(ValueError, match="'gpu0' is not a device name: use 'cpu' or 'cuda:N'"):
        RingLoader(cfg, "nowhere", device="gpu0")


def test_a_cursor_of_another_plan_is_refused_with_what_differs(tmp_path: Path) -> None:
    """Another corpus (its index hash), refused by the stager when the loader's next
    iteration joins it, and by the loader itself at once when it has joined; another
    seed, by the loader at once."""
    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id)
            take(loader, 1)
            state = loader.state_dict()
            other_corpus = state | {"plan": state["plan"] | {"index": "0" * 16}}
            with pytest.raises(PlanMismatch, match=r"\(dataset index differ\)"):
                loader.load_state_dict(other_corpus)  # joined: checked here
            loader.close()
            fresh = RingLoader(stager.cfg, stager.run_id)
            fresh.load_state_dict(other_corpus)  # taken at the next iter()
            with pytest.raises(PlanMismatch, match=r"plan changed .*\(dataset index\)"):
                next(iter(fresh))  # the stager refuses the hello
            with pytest.raises(PlanMismatch, match="seed 7, this run's stager.seed is"):
                fresh.load_state_dict(state | {"seed": 7})
            with pytest.raises(ValueError, match="not a ringfeed cursor"):
                fresh.load_state_dict({"step": 3})
            fresh.load_state_dict(state)  # its own plan: taken
            assert take(fresh, 1)[0]["position"].max() >= state["position"]


def test_the_rank_comes_from_torch_distributeds_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun's RANK and WORLD_SIZE make rank K of N consume run R-wK (its share of the
    global plan: tests/process/test_loader_runs.py); arguments win over them."""
    cfg = small(tmp_path)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert RingLoader(cfg, "R").run_id == "R-w1"
    assert RingLoader(cfg, "R", rank=0, world_size=3).run_id == "R-w0"
    with pytest.raises(ValueError, match="give both, 0 <= rank < world_size"):
        RingLoader(cfg, "R", rank=2, world_size=2)
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK='2' WORLD_SIZE='2'"):
        RingLoader(cfg, "R")


def test_a_new_plan_starts_at_the_epoch_after_the_cursors(tmp_path: Path) -> None:
    """The trainers' --new-plan: a cursor of a changed plan starts a new one at its next
    epoch instead of being refused."""
    with stager_thread(config(tmp_path, stager=BUCKETED["stager"] | {"epochs": 3})) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id)
            state = loader.state_dict() | {"plan": {"index": "0" * 16}}
            loader.load_cursor(state, new_plan=True)
            first = take(loader, 1)[0]
            loader.close()
    assert first["position"][first["valid"]].min() >= N, "epoch 1 begins at position N"


@pytest.mark.gpu
@pytest.mark.parametrize("pin_ring", [True, False], ids=["pinned-ring", "staging"])
def test_rows_arrive_intact_on_a_gpu_while_steps_run_on_another_stream(
    tmp_path: Path, pin_ring: bool
) -> None:
    """On cuda:0 each batch is copied on the loader's side stream while the step's stream
    is busy (a long matmul after every batch): the step's stream waits for the copy's
    event, and record_stream keeps the allocator from handing a batch's memory to the
    next one while the step reads it, so every row is still its item when read back.
    Straight from the ring pinned in place (its slot freed after the copy's event), and
    through the pinned staging buffers."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    busy = torch.randn(2048, 2048, device="cuda:0")
    with stager_thread(config(tmp_path, stager=BUCKETED["stager"] | {"epochs": 4})) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id, device="cuda:0", pin_ring=pin_ring)
            seen = []
            for batch in loader:
                assert loader.ring_pinned == pin_ring, "cudaHostRegister of the ring failed"
                assert all(t.device == torch.device("cuda:0") for t in batch.values())
                for _ in range(4):
                    busy = busy @ busy / busy.norm()  # the step's stream stays busy
                doubled = {k: (t * 2 if t.is_floating_point() else t) for k, t in batch.items()}
                arrays = {
                    k: (t / 2 if t.is_floating_point() else t).cpu().numpy()
                    for k, t in doubled.items()
                }
                seen += check_synthetic_rows(arrays, int(arrays["valid"].sum()), loader.cfg)
    assert sorted(seen) == sorted(list(range(N)) * 4), "each item once an epoch, every row its own"


def partly_iterated(loader: RingLoader, then: Callable[[], object] = lambda: None) -> weakref.ref:
    """One batch of loader, then `then`; the loader dropped unclosed (as a notebook cell
    run again drops it): its weak reference."""
    it = iter(loader)
    next(it)
    then()
    return weakref.ref(loader)


def assert_collected(gone: weakref.ref) -> None:
    """The dropped loader is collected (its finalizer ends the stager and producers it
    started) and its stream's thread ends."""
    gc.collect()
    assert gone() is None, "the dropped loader is still reachable"
    streams = lambda: [t for t in threading.enumerate() if t.name.endswith("-stream")]  # noqa: E731
    wait_for(lambda: not streams(), 10, "the dropped loader's stream to end")


def test_a_loader_dropped_without_close_is_collected_and_its_stream_ends(tmp_path: Path) -> None:
    """Its stream's thread held the loader through bound methods, and a live thread is
    never collected, so a dropped loader's stager and producers ran until the
    interpreter's exit."""
    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            assert_collected(partly_iterated(RingLoader(stager.cfg, stager.run_id, device="cpu")))


def test_a_loader_dropped_after_its_copy_raised_is_collected_too(tmp_path: Path) -> None:
    """The same after place() raised (a device out of memory) with the queue full: the
    error waiting for the caller must not hold the loader through its traceback's
    frames, or the stream waits with it for ever."""
    calls = [0]

    class Failing(RingLoader):
        def place(self, arrays):  # type: ignore[no-untyped-def]
            calls[0] += 1
            if calls[0] > 3:  # the 4th: the queue (prefetch 2) is full by then
                raise RuntimeError("out of memory (a test's)")
            return super().place(arrays)

    def raised() -> None:
        wait_for(lambda: calls[0] >= 4, 10, "the copy that raises")
        time.sleep(0.3)  # its error waits in the full queue

    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = Failing(stager.cfg, stager.run_id, device="cpu")
            gone = partly_iterated(loader, raised)
            del loader
            assert_collected(gone)
