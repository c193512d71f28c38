"""The batch ring as an iterator of ``jax.Array`` batches: ``ringfeed.jax.RingLoader``
(docs/loaders.md).

    loader = RingLoader(cfg, run_id)                 # data-parallel over local devices
    loader.set_state(saved)                          # optional: resume exactly there
    for batch in loader:                             # dict of jax.Arrays, sharded
        state = train_step(state, batch)             # jitted: once per length bucket
        save(state, loader.get_state())              # plain ints and strings

Each batch is a dict of every field of the declared schema, as the PyTorch loader's
(consumer/client/torch_loader.py), placed with one ``jax.sharding.Sharding`` whose
first axis is the batch: by default a 1-D mesh over every device, axis "data", the
batch split across the local devices. Rows are padded to a multiple of the local
devices holding a shard (zeros, valid False, items and position -1, the padding
speaker and language ids: shared/run/id_tables.py padding_ids), so each bucket keeps
one static shape and a jitted step compiles once per bucket.

Two batches are on their way to the devices while the step runs: the stream's thread
(consumer/client/batch_stream.py) calls device_put, which returns at once. On a GPU
the batch ring is pinned in place (host_pin.py) with the XLA client's dma_map (a
cudaHostRegister of the mapping, once), and device_put of a view of a pinned slot
copies straight from it with no staging buffer (XLA stages only what is not
DMA-mapped, and keeps the view until its transfer is done): the slot goes back to the
stager once the arrays are ready, which the thread asks with is_ready() and never
waits for on the device. A batch whose rows must be padded to the devices, and a ring
that could not be pinned (the CPU, where dma_map is not implemented and device_put
may alias the host array), are copied out of the slot into a fresh host array first
(the slot is then freed at once), as before. A thread that synchronizes the device
breaks the CUDA graphs XLA captures for command buffers (docs/loaders.md#jax,
FIELD-NOTES: DALI's JAX iterator): this one never does.

Under multi-host JAX, each process is one training worker: process K of N consumes
run ``R-wK``, its share of the global plan (`ringfeed run CONFIG --run-id R --worker
K/N`), and its rows become its part of the global array
(``jax.make_array_from_process_local_data``); the cursor is global.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from ringfeed.consumer.client.host_pin import HostPin
from ringfeed.consumer.client.loader_base import (
    PREFETCH,
    RingLoaderBase,
    per_rank_batch,
    resolve_run,
)
from ringfeed.consumer.client.progress import PROGRESS_EVERY
from ringfeed.shared.config import Config
from ringfeed.shared.config.environment import torch_worker
from ringfeed.shared.run.id_tables import padding_ids
from ringfeed.shared.run.share import Share

# The mesh axis of the default sharding: the batch dimension.
DATA_AXIS = "data"
# What a padding row holds in these fields (every other field: zeros, valid False).
PLAN_ROW_FIELDS = ("items", "position")
# How often a slot read by a copy in flight asks whether the copy has ended, seconds: a
# 6.5 MB batch takes ~0.1 ms at the ~55 GB/s of registered memory (FIELD-NOTES.md).
READY_POLL_S = 0.0002


def device_name(device: jax.Device) -> str:
    return f"{device.platform}:{device.id}"


def resolve_devices(names: Sequence[str | jax.Device]) -> list[jax.Device]:
    """jax devices by name ("cpu:0", "gpu:1"; "cuda" is "gpu"), checked to exist here;
    ValueError naming the device and those this process sees otherwise."""
    seen = ", ".join(device_name(d) for d in jax.devices())
    out = []
    for name in names:
        if isinstance(name, jax.Device):
            out.append(name)
            continue
        platform, _, index = str(name).partition(":")
        platform = {"cuda": "gpu"}.get(platform, platform)
        try:
            found = {d.id: d for d in jax.devices(platform)}
        except RuntimeError:
            found = {}
        if not index.isdigit() and index:
            raise ValueError(
                f"device {name!r} is not a device name: write it as 'cpu:0' or "
                f"'gpu:1' (this process sees {seen})"
            )
        key = int(index) if index else min(found, default=-1)
        if key not in found:
            raise ValueError(f"device {name!r} does not exist: this process sees {seen}")
        out.append(found[key])
    return out


def data_parallel(devices: Sequence[jax.Device] | None = None) -> NamedSharding:
    """The default sharding: a 1-D mesh over `devices` (default every device of every
    process), the batch's first axis split along it, the other axes whole."""
    mesh = Mesh(np.array(list(devices) if devices else jax.devices()), (DATA_AXIS,))
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def xla_host_pin(sharding: Sharding) -> HostPin:
    """The batch ring pinned for copies to the sharding's devices with their client's
    dma_map (every local device shares one client: cuMemHostRegister, portable); on
    the CPU it is not implemented, and the pin says so once."""
    devices = sorted(sharding.addressable_devices, key=lambda d: d.id)
    client = devices[0].client

    def register(address: int, nbytes: int) -> str:
        try:
            client.dma_map(address, nbytes)
        except Exception as exc:  # JaxRuntimeError (XlaRuntimeError in older JAX): said
            return f"dma_map: {exc}"
        return ""

    def unregister(address: int) -> str:
        try:
            client.dma_unmap(address)
        except Exception as exc:  # as register's
            return f"dma_unmap: {exc}"
        return ""

    names = ", ".join(device_name(d) for d in devices)
    return HostPin(register, unregister, names, on_gpu=devices[0].platform == "gpu")


class ArraysReady:
    """The end of device_put's copies out of pinned slots: every array ready. The wait
    polls is_ready(), a query of the arrays' own events: this thread never waits on
    the device (a thread that synchronizes it breaks XLA's command buffers)."""

    def __init__(self, arrays: list[jax.Array]) -> None:
        self.arrays = arrays

    def query(self) -> bool:
        # One a step consumed (donated, deleted) was copied before that step could run;
        # is_ready() of a deleted array crashed the process (a segfault, jax 0.10.2 on CPU).
        return all(a.is_deleted() or a.is_ready() for a in self.arrays)

    def synchronize(self) -> None:
        while not self.query():
            time.sleep(READY_POLL_S)


def process_share(worker: tuple[int, int] | None) -> Share:
    """This training worker: `worker` (K, N); else, under multi-host JAX, its process
    index and count; else RANK and WORLD_SIZE, which the launcher sets for a command it
    starts as worker K of N (`ringfeed run --worker K/N -- COMMAND`); else the one."""
    if worker is not None:
        return Share(*worker)
    if jax.process_count() > 1:
        return Share(jax.process_index(), jax.process_count())
    found = torch_worker()
    return Share(*found) if found else Share()


class RingLoader(RingLoaderBase[dict[str, jax.Array]]):
    """A run's batches as dicts of jax.Arrays placed with `sharding`, two ahead."""

    name = "jax"

    def __init__(
        self,
        cfg: Config | str | Path | None = None,
        run_id: str | None = None,
        *,
        sharding: Sharding | None = None,
        devices: Sequence[str | jax.Device] | None = None,
        worker: tuple[int, int] | None = None,
        batch_size: int | None = None,
        max_steps: int = 0,
        epochs: int = 0,
        progress_every: int = PROGRESS_EVERY,
        prefetch: int = PREFETCH,
        stop: Callable[[], bool] | None = None,
        pin_ring: bool = True,
    ) -> None:
        """cfg: a Config, a dict of one or its file; cfg and run_id default to the
        launcher's (RINGFEED_CONFIG, RINGFEED_RUN_ID), and with no run the loader starts
        the data side itself; sharding: how every field is placed (its first axis is the
        batch), default data_parallel(devices); devices: names ("gpu:0", "cpu:0") or jax
        devices, checked here; worker: (K, N), default (jax.process_index(),
        jax.process_count()); batch_size: this process's rows (default
        stager.batch_size / N); max_steps, epochs: where iteration ends (0: the plan's
        end); progress_every: a progress line every this many steps (0: none);
        pin_ring: put straight from the batch ring, pinned in place, where the devices
        allow (False: through a fresh host array always, as benchmarks/gpu_feed.py
        compares)."""
        if sharding is None:
            sharding = data_parallel(resolve_devices(devices) if devices else None)
        elif devices:
            raise ValueError("give sharding= or devices=, not both (a sharding names its devices)")
        cfg, run_id = resolve_run(cfg, run_id)
        share = process_share(worker)
        cfg = per_rank_batch(cfg, batch_size, share, run_id)
        super().__init__(
            cfg,
            run_id,
            share,
            prefetch,
            stop,
            max_steps=max_steps,
            epochs=epochs,
            progress_every=progress_every,
        )
        self.sharding, self.pin_ring = sharding, pin_ring
        self.host_pin = xla_host_pin(sharding) if pin_ring else None
        self._loss_seen = 0.0
        # Each process's rows are split over its devices that hold a shard.
        local = len(sharding.addressable_devices)
        self.row_multiple = 1 if sharding.is_fully_replicated else local
        self._pad = self._pad_values()
        self._local_only = jax.process_count() == 1

    def _pad_values(self) -> dict[str, Any]:
        speaker, language = padding_ids(self.cfg)
        return {"items": -1, "position": -1, "speaker": speaker, "language": language}

    @property
    def batch_size(self) -> int:
        """This process's rows per batch (the fixed shape's; a bucket's may be fewer)."""
        return self.share.rows(self.cfg.stager.batch_size)

    @property
    def global_batch_size(self) -> int:
        """Every process's rows together: stager.batch_size."""
        return self.cfg.stager.batch_size

    def get_state(self) -> dict[str, Any]:
        """The cursor after the last batch handed out: plain ints and strings, for any
        checkpointer (orbax: ringfeed.jax.CursorSave, a pickle, a sidecar file)."""
        return self.cursor.to_dict()

    def set_state(self, state: dict[str, Any]) -> None:
        """Resume at `state` (a get_state(), or a trainer checkpoint's cursor) from the
        next batch: its seed checked here, its plan here once the stager's is known,
        else when the next iteration connects (PlanMismatch naming what differs)."""
        self.load_cursor(state)

    # The loader's own state under the names torch's DataLoader gives it.
    state_dict, load_state_dict = get_state, set_state

    def loss_value(self, loss: Any) -> float:
        """The loss noted, as a float, without waiting for the device: a jax.Array not
        yet computed gives the last one that was (the step's dispatch stays async)."""
        ready = getattr(loss, "is_ready", None)
        if ready is not None and not ready():
            return self._loss_seen
        self._loss_seen = float(loss)
        return self._loss_seen

    def place(self, arrays: dict[str, np.ndarray]) -> tuple[_Placed, ArraysReady | None]:
        """device_put of each field: of its slot where the ring is pinned and the rows
        need no padding (the arrays ready returned: the slot waits for them), else of a
        host copy out of the slot, padded to the devices."""
        rows = len(arrays["items"])
        padded = -(-rows // self.row_multiple) * self.row_multiple
        pin = self.host_pin
        in_place = set()
        if padded == rows and pin is not None:
            in_place = {name for name, array in arrays.items() if pin.covers(array)}
        host = {}
        for name, array in arrays.items():
            if name in in_place:
                host[name] = array  # the copy to the device reads the pinned slot
                continue
            out = np.empty((padded, *array.shape[1:]), array.dtype)
            out[:rows] = array  # the one host copy out of the slot
            if padded > rows:
                out[rows:] = self._pad.get(name, 0)
            host[name] = out
        frames = int(arrays["mel_lens"].sum()) if "mel_lens" in arrays else 0
        if self._local_only:
            placed = jax.device_put(host, self.sharding)  # returns at once: no wait here
        else:
            placed = {
                name: jax.make_array_from_process_local_data(self.sharding, a)
                for name, a in host.items()
            }
        reading = ArraysReady([placed[name] for name in in_place]) if in_place else None
        return _Placed(placed, frames), reading

    def hand_out(self, placed: Any, used: Callable[[], None]) -> dict[str, jax.Array]:
        used()  # a plain dict (a pytree): the cursor moves when it is handed out
        return placed.arrays

    UNPICKLED = (*RingLoaderBase.UNPICKLED, "sharding")

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Devices do not pickle: a copy places with data_parallel() over its own."""
        super().__setstate__(state)
        self.sharding = data_parallel()
        self.host_pin = xla_host_pin(self.sharding) if self.pin_ring else None


class _Placed:
    """A batch on its way to the devices, and its true mel frames."""

    __slots__ = ("arrays", "frames")

    def __init__(self, arrays: dict[str, jax.Array], frames: int) -> None:
        self.arrays, self.frames = arrays, frames
