"""The batch ring as a PyTorch iterable: ``ringfeed.torch.RingLoader``, where a
DataLoader was (docs/loaders.md).

    loader = RingLoader(cfg, run_id, device="cuda:0")
    loader.load_state_dict(ckpt["data"])            # optional: resume exactly there
    for batch in loader:                             # dict of tensors on the device
        loss = step(batch)
        ckpt = {"model": ..., "data": loader.state_dict()}

Each batch is a dict of every field of the declared schema (tokens int32 [B, T],
text_lens, mel float32 [B, F, n_mels], mel_lens, speaker, language, items and
position int64, valid bool, the optional fields): with length buckets each batch has
its bucket's shape, and rows past the plan's (valid False, items and position -1) are
padding (docs/running.md#what-a-batch-says-about-itself).

On a GPU, batch k + 1 is copied while step k runs (the stream's thread,
consumer/client/batch_stream.py), with a non-blocking copy on a side CUDA stream and an
event recorded after it. The batch ring is pinned in place (host_pin.py): each mapping
of it registered once with cudaHostRegister (flags 0, in the device's context), so the
copy reads the batch slot itself, and the slot is freed only when the copy's event has
completed; there is no host copy. Where registration fails (a locked-memory limit, a
driver that refuses) the loader says so once and copies each batch out of the slot into
one of three pinned host buffers first (the slot is then freed at once), as it did
before. When the batch is handed out, the step's stream waits for the copy's event (the
device waits, not the host) and each tensor is marked used on it (record_stream): they
were allocated on the side stream, and without the mark the caching allocator could
give their memory to the next batch while the step still reads it. A pinned buffer is
refilled only after the event of its last copy. On the CPU a batch is one copy out of
the slot into tensors (and the ring is not pinned, which is said once).

Under torch.distributed each rank is one training worker: rank K of N consumes run
``R-wK``, its share of the global plan (`ringfeed run CONFIG --run-id R --worker K/N`
starts it); the cursor is global, so rank 0's state_dict resumes every rank.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ringfeed.consumer.client.host_pin import HostPin
from ringfeed.consumer.client.loader_base import (
    PREFETCH,
    RingLoaderBase,
    per_rank_batch,
    resolve_run,
)
from ringfeed.consumer.client.progress import PROGRESS_EVERY
from ringfeed.consumer.client.ring_batch import RingBatch
from ringfeed.shared.config import Config
from ringfeed.shared.config.environment import cuda_visible_devices, torch_worker
from ringfeed.shared.run.share import Share


def visible_devices() -> list[str]:
    """The devices this process can place tensors on, named as torch names them."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [
            f"cuda:{k} ({torch.cuda.get_device_name(k)})" for k in range(torch.cuda.device_count())
        ]
    return names


def resolve_device(device: str | torch.device) -> torch.device:
    """torch.device(device), checked to exist here; ValueError naming it and the
    devices this process sees otherwise."""
    seen = ", ".join(visible_devices())
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device {device!r} is not a device name: use 'cpu' or 'cuda:N' "
            f"(this process sees {seen})"
        ) from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ValueError(
            f"device {device!r}: the loader places batches on 'cpu' or 'cuda:N' "
            f"(this process sees {seen})"
        )
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {device!r} does not exist: this process sees no CUDA device "
            f"(torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
            f"{cuda_visible_devices()!r}); it sees {seen}"
        )
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} does not exist: this process sees {seen}")
    return torch.device("cuda", index)


def distributed_share(rank: int | None, world_size: int | None) -> Share:
    """This process's training worker: the arguments, else torch.distributed's rank
    and world size once it is initialized, else RANK and WORLD_SIZE (torchrun's), else
    the one worker."""
    if rank is not None or world_size is not None:
        if rank is None or world_size is None or not 0 <= rank < world_size:
            raise ValueError(
                f"rank={rank}, world_size={world_size}: give both, 0 <= rank < world_size"
            )
        return Share(rank, world_size)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return Share(dist.get_rank(), dist.get_world_size())
    found = torch_worker()
    return Share(*found) if found else Share()


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy one (bool, int32, int64, float16, float32, ...)."""
    return torch.from_numpy(np.empty(0, dtype)).dtype


def cuda_host_pin(device: torch.device) -> HostPin:
    """The batch ring pinned for copies to `device` with cudaHostRegister (flags 0, in
    the device's context, as LMCache and DeepSpeed pin shared memory); on the CPU
    nothing is registered, and the pin says so once."""

    def register(address: int, nbytes: int) -> str:
        if device.type != "cuda":
            return "the loader's device is the CPU"
        return _call_cudart(device, "cudaHostRegister", address, nbytes, 0)

    def unregister(address: int) -> str:
        return _call_cudart(device, "cudaHostUnregister", address)

    return HostPin(register, unregister, str(device), on_gpu=device.type == "cuda")


def _call_cudart(device: torch.device, name: str, *args: int) -> str:
    """The CUDA runtime call `name`(*args) in the device's context, in a thread that
    ends with it: "" or its error. A failed runtime call stays its thread's last error,
    which PyTorch's next kernel launch in that thread reports as its own
    (cudaGetLastError), so the training thread never makes one."""
    said: list[str] = []

    def call() -> None:
        try:
            with torch.cuda.device(device):
                code = int(getattr(torch.cuda.cudart(), name)(*args))
            torch.cuda.check_error(code)
            said.append("")
        except Exception as exc:  # said by the pin; the staging copy works without it
            said.append(f"{name}: {type(exc).__name__}: {exc}")

    thread = threading.Thread(target=call, name="ring-pin", daemon=True)
    thread.start()
    thread.join()
    return said[0] if said else f"{name} ended its thread"


@dataclass
class Placed:
    """A batch on its way to the device: its tensors, the event after their copy (None
    on the CPU), and its true mel frames (for the step numbers)."""

    tensors: dict[str, torch.Tensor]
    event: torch.cuda.Event | None = None
    frames: int = 0


@dataclass
class PinnedBuffer:
    """One pinned host tensor per field, grown to the largest batch seen (a few times
    at most, once per larger bucket); `event`: the end of its last copy to the device."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    event: torch.cuda.Event | None = None

    def fill(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The one host copy: each array into this buffer, as tensors of its shape."""
        if self.event is not None:
            self.event.synchronize()  # its last copy to the device has read it
        out = {}
        for name, array in arrays.items():
            dtype = torch_dtype(array.dtype)
            held = self.tensors.get(name)
            if held is None or held.numel() < array.size or held.dtype != dtype:
                held = torch.empty(max(array.size, 1), dtype=dtype, pin_memory=True)
                self.tensors[name] = held
            view = held[: array.size].view(array.shape)
            np.copyto(view.numpy(), array)
            out[name] = view
        return out


class RingLoader(RingLoaderBase[dict[str, torch.Tensor]]):
    """A run's batches as dicts of tensors on `device`, two placed ahead of the step:
    one epoch per pass, `len` the epoch's batches for this rank."""

    name = "torch"

    def __init__(
        self,
        cfg: Config | str | Path | dict | None = None,
        run_id: str | None = None,
        device: str | torch.device = "cpu",
        *,
        batch_size: int | None = None,
        max_steps: int = 0,
        epochs: int = 0,
        progress_every: int = PROGRESS_EVERY,
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int = PREFETCH,
        stop: Callable[[], bool] | None = None,
        pin_ring: bool = True,
    ) -> None:
        """cfg: a Config, a dict of one or its file; cfg and run_id default to the
        launcher's (RINGFEED_CONFIG, RINGFEED_RUN_ID), and with no run the loader starts
        the data side itself; device: 'cpu' or 'cuda:N', checked here; batch_size: this
        rank's rows (the DataLoader's meaning; default stager.batch_size / world_size);
        max_steps, epochs: where iteration ends (0: the plan's end); progress_every: a
        progress line every this many steps (0: none); rank, world_size: this training
        worker (default: torch.distributed's); pin_ring: copy straight from the batch
        ring, pinned in place, where CUDA allows (False: through pinned staging
        buffers always, as benchmarks/gpu_feed.py compares)."""
        self.device = resolve_device(device)
        self.pin_ring = pin_ring
        cfg, run_id = resolve_run(cfg, run_id)
        share = distributed_share(rank, world_size)
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
        self._device_side()

    def _device_side(self) -> None:
        self._cuda = self.device.type == "cuda"
        self.host_pin = cuda_host_pin(self.device) if self.pin_ring else None
        if self._cuda:
            self._side = torch.cuda.Stream(self.device)
            # Each refilled only after its copy's event: the queue holds `prefetch`, the
            # stream's thread fills one more.
            self._buffers = [PinnedBuffer() for _ in range(self.prefetch + 1)]
            self._filled = 0

    @property
    def batch_size(self) -> int:
        """This rank's rows per batch (the fixed shape's; a bucket's may be fewer)."""
        return self.share.rows(self.cfg.stager.batch_size)

    @property
    def global_batch_size(self) -> int:
        """Every rank's rows together: stager.batch_size, as tf.distribute counts it."""
        return self.cfg.stager.batch_size

    def state_dict(self) -> dict[str, Any]:
        """The cursor after the last batch the step used (read ahead or not): plain ints
        and strings."""
        return self.cursor.to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at `state` (a state_dict, or a TensorFlow checkpoint's cursor) from the
        next batch: the one after the last batch it had used. Its seed is checked here,
        its plan here once the stager's is known, else when the next iteration
        connects: PlanMismatch names what differs."""
        self.load_cursor(state)

    def place(self, arrays: dict[str, np.ndarray]) -> tuple[Placed, torch.cuda.Event | None]:
        """The copy of each field to the device: from its slot where the ring is pinned
        (the event returned: the slot waits for it), else out of the slot into a pinned
        buffer first (what is not in the slot, the epochs, always)."""
        frames = int(arrays["mel_lens"].sum()) if "mel_lens" in arrays else 0
        if not self._cuda:
            copies = {k: torch.from_numpy(np.array(a, copy=True)) for k, a in arrays.items()}
            return Placed(copies, frames=frames), None
        pin = self.host_pin
        in_place = {k for k, a in arrays.items() if pin is not None and pin.covers(a)}
        buffer = self._buffers[self._filled % len(self._buffers)]
        self._filled += 1
        staged = buffer.fill({k: a for k, a in arrays.items() if k not in in_place})
        with torch.cuda.device(self.device), torch.cuda.stream(self._side):
            try:
                tensors = {
                    k: (torch.from_numpy(a) if k in in_place else staged[k]).to(
                        self.device, non_blocking=True
                    )
                    for k, a in arrays.items()
                }
            except BaseException:
                self._side.synchronize()  # the copies issued end before the slot is freed
                raise
            event = torch.cuda.Event()
            event.record(self._side)
        buffer.event = event
        return Placed(tensors, event, frames), event if in_place else None

    def hand_out(self, placed: Placed, used: Callable[[], None]) -> dict[str, torch.Tensor]:
        if placed.event is not None:
            step_stream = torch.cuda.current_stream(self.device)
            step_stream.wait_event(placed.event)
            for tensor in placed.tensors.values():
                tensor.record_stream(step_stream)
        return RingBatch.reporting(placed.tensors, used)

    UNPICKLED = (*RingLoaderBase.UNPICKLED, "_side", "_buffers", "_filled")

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._device_side()
