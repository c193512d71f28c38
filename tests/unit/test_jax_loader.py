"""ringfeed.jax.RingLoader against the real stager in this process: batches placed
data-parallel over the two host devices (tests/conftest.py XLA_FLAGS), padded to a
multiple of them with padding rows, every real row its item; a jitted step compiles
once per length bucket; the cursor resumes exactly; a device that does not exist and
a cursor of another plan are refused. (The JAX trainer: tests/process/test_jax_e2e.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ringfeed.producer.sources import check_synthetic_rows
from ringfeed.shared.run.id_tables import padding_ids
from tests.support.configs import small
from tests.support.producer_threads import producer_threads
from tests.support.stager_thread import stager_thread

jax = pytest.importorskip("jax")

from ringfeed.jax import PlanMismatch, RingLoader  # noqa: E402

N = 48
# LJSpeech-shaped lengths in three length buckets of 10, 6 and 5 rows (a frame budget
# of 5 x 32): the last bucket's rows are odd, and two devices need an even count.
BUCKETED = {
    "data": {"synthetic_lengths": "ljspeech"},
    "features": {"max_frames": 32},
    "stager": {"batch_size": 5, "buckets": [16, 24, 32]},
}


def config(tmp_path: Path) -> Path:
    return small(tmp_path, items=N, delay_s=0.0, **BUCKETED)


def take(loader: RingLoader, n: int | None = None, step=None) -> list[dict[str, np.ndarray]]:
    """n batches (None: to the plan's end) as numpy, every row checked against its item;
    step(batch) runs on each as it comes."""
    batches = []
    for batch in loader:
        if step is not None:
            step(batch)
        arrays = {name: np.asarray(a) for name, a in batch.items()}
        check_synthetic_rows(arrays, int(arrays["valid"].sum()), loader.cfg)
        batches.append(arrays)
        if n is not None and len(batches) == n:
            break
    return batches


def test_batches_are_sharded_over_the_devices_and_a_step_compiles_once_per_bucket(
    tmp_path: Path,
) -> None:
    assert len(jax.devices()) == 2, "tests/conftest.py asks XLA for two host devices"
    traces: list[tuple] = []

    @jax.jit
    def step(batch: dict) -> jax.Array:
        traces.append(batch["mel"].shape)  # runs once per trace
        keep = batch["valid"][:, None, None]
        return (batch["mel"] * keep).sum() + batch["tokens"].sum()

    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id)
            first = next(loader)
            mel = first["mel"]
            assert len(mel.sharding.device_set) == 2 and mel.sharding.spec[0] == "data"
            assert mel.addressable_shards[0].data.shape[0] == mel.shape[0] // 2
            step(first)
            batches = take(loader, step=step)
        assert stager.ended() == 0
    shapes = {b["mel"].shape for b in batches} | {mel.shape}
    assert len(shapes) > 1 and all(rows % 2 == 0 for rows, _, _ in shapes), shapes
    assert sorted(traces) == sorted(shapes), "one compilation per bucket shape"
    speaker, language = padding_ids(stager.cfg)
    assert any(rows == 6 and frames == 32 for rows, frames, _ in shapes), "5 rows padded to 6"
    for b in batches:  # rows added for the devices are padding rows
        pad = ~b["valid"]
        assert (b["items"][pad] == -1).all() and (b["position"][pad] == -1).all()
        assert (b["speaker"][pad] == speaker).all() and (b["language"][pad] == language).all()
    items = sorted(i for b in batches for i in b["items"][b["valid"]].tolist())
    assert items == sorted(set(range(N)) - set(np.asarray(first["items"]).tolist()))


def test_get_state_resumes_the_plan_exactly_where_it_stopped(tmp_path: Path) -> None:
    def rows(batches: list[dict]) -> list[tuple]:
        return [(b["mel"].shape, b["items"].tolist()) for b in batches]

    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            whole = rows(take(RingLoader(stager.cfg, stager.run_id)))
    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            first = RingLoader(stager.cfg, stager.run_id)
            head = rows(take(first, 4))
            state = first.get_state()
            first.close()
            resumed = RingLoader(stager.cfg, stager.run_id)
            resumed.set_state(state)
            tail = rows(take(resumed))
    assert head + tail == whole


def test_a_device_that_does_not_exist_or_a_cursor_of_another_plan_is_refused(
    tmp_path: Path,
) -> None:
    cfg = small(tmp_path)
    with pytest.raises(ValueError, match=r"'gpu:3' does not exist: this process sees cpu:0, cpu:1"):
        RingLoader(cfg, "nowhere", devices=["gpu:3"])
    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id, devices=["cpu:1"])
            assert loader.row_multiple == 1, "one device: no rows added"
            assert take(loader, 1)[0]["mel"].shape[0] in (10, 6, 5)
            state = loader.get_state()
            loader.close()
            other = state | {"plan": state["plan"] | {"buckets": "0" * 16}}
            fresh = RingLoader(stager.cfg, stager.run_id)
            fresh.set_state(other)  # checked when the next iteration joins the stager
            with pytest.raises(PlanMismatch, match=r"\(buckets\)"):
                next(iter(fresh))


def test_the_worker_comes_from_the_launcher_in_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JAX command the launcher starts as worker 1 of 2 (RANK, WORLD_SIZE) consumes run
    R-w1; an explicit worker wins."""
    cfg = small(tmp_path)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert RingLoader(cfg, "R").run_id == "R-w1"
    assert RingLoader(cfg, "R", worker=(0, 2)).run_id == "R-w0"


@pytest.mark.gpu
def test_batches_placed_on_a_gpu_hold_their_items(tmp_path: Path) -> None:
    """On a GPU the loader's thread puts each batch without waiting for the device,
    straight from the ring pinned in place (dma_map) where no row is padded; a jitted
    step reads it as it comes, every row its item, one compile per bucket."""
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("no GPU for JAX")
    traces: list[tuple] = []

    @jax.jit
    def double(batch: dict) -> dict:
        traces.append(batch["mel"].shape)
        return {k: v * 2 if v.dtype == jax.numpy.float32 else v for k, v in batch.items()}

    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id, devices=[f"gpu:{gpus[0].id}"])
            seen = []
            for batch in loader:
                assert loader.ring_pinned, "dma_map of the ring failed"
                out = double(batch)
                arrays = {
                    k: np.asarray(v) / 2 if v.dtype == jax.numpy.float32 else np.asarray(v)
                    for k, v in out.items()
                }
                seen += check_synthetic_rows(arrays, int(arrays["valid"].sum()), loader.cfg)
    assert sorted(seen) == list(range(N)) and len(traces) == len(set(traces))


class Pending:
    """A loss the device has not computed yet: float() of it would wait."""

    def is_ready(self) -> bool:
        return False

    def __float__(self) -> float:
        raise AssertionError("note_loss waited for the device")


def test_note_loss_takes_a_device_array_and_never_waits_for_it(tmp_path: Path) -> None:
    """A step's loss not yet computed is reported as the last one that was."""
    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id, progress_every=0)
            it = iter(loader)
            next(it)
            loader.note_loss(jax.numpy.float32(2.5))  # computed: read when the next comes
            next(it)
            loader.note_loss(Pending())
            next(it)
            loader.close(finished=True)
    assert loader.last_loss == 2.5 and loader.steps == 3, "each step reported, none waited"


def test_the_cursor_saves_and_restores_through_orbaxs_checkpoint_manager(tmp_path: Path) -> None:
    """Beside the model's state, in one CheckpointManager step (docs/loaders.md#jax);
    the restored loader goes on with the batch after the last one handed out."""
    ocp = pytest.importorskip("orbax.checkpoint")
    with stager_thread(config(tmp_path)) as stager:
        with producer_threads(stager.cfg, stager.control, n=2):
            loader = RingLoader(stager.cfg, stager.run_id, progress_every=0)
            head = take(loader, 2)
            params = {"w": jax.numpy.ones(3)}
            with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
                manager.save(
                    2,
                    args=ocp.args.Composite(
                        params=ocp.args.StandardSave(params),
                        data=ocp.args.JsonSave(loader.get_state()),
                    ),
                )
                manager.wait_until_finished()
            loader.close()
            with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
                restored = manager.restore(
                    manager.latest_step(),
                    args=ocp.args.Composite(
                        params=ocp.args.StandardRestore(params), data=ocp.args.JsonRestore()
                    ),
                )
            resumed = RingLoader(stager.cfg, stager.run_id, progress_every=0)
            resumed.set_state(restored.data)
            tail = take(resumed)
    positions = [p for b in head + tail for p in b["position"][b["valid"]].tolist()]
    assert positions == list(range(N)) and (restored.params["w"] == 1).all()


def test_a_donated_batch_counts_as_copied() -> None:
    """A step that donates its batch deletes its arrays; their copies out of the slot
    ended before that step ran, so the slot is free to go (is_ready() of a deleted array
    crashed the process: a segfault, jax 0.10.2 on CPU)."""
    import jax.numpy as jnp

    from ringfeed.consumer.client.jax_loader import ArraysReady

    kept, donated = jnp.ones(4), jnp.zeros(4)
    donated.delete()
    ready = ArraysReady([kept, donated])
    ready.synchronize()
    assert ready.query()
