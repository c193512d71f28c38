"""PyTorch and JAX for benchmarks/gpu_feed.py: each framework's model step (the example
trainers' own: consumer/trainer/torch_example/, jax_example/), its ringfeed loader and
its DataLoader peer over the exported cached mels.

    fw = make("torch", cfg, "auto")
    step = fw.make_step(n_layers)          # step(batch) -> the loss, not yet waited for
    batches = fw.ringfeed(run_id)          # or fw.dataloader(folder, n, workers)
    fw.ringfeed(run_id, pin_ring=False)    # the same loader through its host copy
    fw.ring_pinned(False)                  # was that loader's ring pinned in place?
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ringfeed.consumer.trainer.model_kwargs import default_model_kwargs
from ringfeed.shared.config import Config, replace

# The fields a model step reads (the example trainers' INPUTS).
INPUTS = ("tokens", "text_lens", "mel", "mel_lens", "speaker", "language")


def repeat(batch: dict) -> Iterator[dict]:
    """The ideal feed: the same resident batch, for ever."""
    return itertools.repeat(batch)


# The DataLoader's epoch is this many passes over the exported clips, as over a corpus
# 16x larger: no epoch boundary (its workers' refill) falls inside a figure, as none
# does in ringfeed's endless plan.
PASSES = 16


class CachedMels:
    """The exported mels and tokens (peer_pipelines.export_cached), one clip per item,
    PASSES times over; a torch Dataset (__len__, __getitem__), picklable for spawned
    workers."""

    def __init__(self, folder: Path, n: int, cfg: Config) -> None:
        self.folder, self.n, self.n_mels = str(folder), n, cfg.features.n_mels
        self.max_frames, self.max_text = cfg.features.max_frames, cfg.text.max_text_len

    def __len__(self) -> int:
        return self.n * PASSES

    def __getitem__(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        i = k % self.n
        mel = np.fromfile(f"{self.folder}/{i}.mel", np.float32).reshape(-1, self.n_mels)
        return mel[: self.max_frames], np.fromfile(f"{self.folder}/{i}.tok", np.int32)[
            : self.max_text
        ]


class Collate:
    """Rows padded into one batch of ringfeed's fixed shape, as numpy (or torch) arrays."""

    def __init__(self, cfg: Config, as_torch: bool) -> None:
        self.n_mels, self.as_torch = cfg.features.n_mels, as_torch
        self.max_frames, self.max_text = cfg.features.max_frames, cfg.text.max_text_len

    def __call__(self, rows: list[tuple[np.ndarray, np.ndarray]]) -> dict:
        b = len(rows)
        batch = {
            "mel": np.zeros((b, self.max_frames, self.n_mels), np.float32),
            "tokens": np.zeros((b, self.max_text), np.int32),
            "mel_lens": np.array([len(m) for m, _ in rows], np.int32),
            "text_lens": np.array([len(t) for _, t in rows], np.int32),
            "speaker": np.zeros(b, np.int32),
            "language": np.zeros(b, np.int32),
        }
        for row, (mel, tokens) in enumerate(rows):
            batch["mel"][row, : len(mel)] = mel
            batch["tokens"][row, : len(tokens)] = tokens
        if self.as_torch:
            import torch

            return {k: torch.from_numpy(v) for k, v in batch.items()}
        return batch


def data_loader(cfg: Config, folder: Path, n: int, workers: int, pin: bool, **kw: Any):
    """torch's DataLoader over the exported mels as a PyTorch user sets it up."""
    from torch.utils.data import DataLoader

    return DataLoader(
        CachedMels(folder, n, cfg),
        batch_size=cfg.stager.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=pin,
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers else None,
        **kw,
    )


def every_epoch(loader: Any) -> Iterator[dict]:
    """A RingLoader's passes one after another (a pass is one epoch), to the plan's end."""
    while not (loader.finished or loader.stopped):
        yield from loader


def forever(loader: Any) -> Iterator[dict]:
    """Epoch after epoch of a DataLoader (persistent workers: no restart between)."""
    while True:
        yield from loader


class TorchFramework:
    """The PyTorch example model, ringfeed.torch, and the DataLoader, on cuda:0 or cpu."""

    def __init__(self, cfg: Config, device: str) -> None:
        import torch

        self.torch, self.cfg = torch, cfg
        cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        self.device = "cuda:0" if cuda else "cpu"
        self.device_name = torch.cuda.get_device_name(0) if cuda else "cpu"
        if cuda:  # as a PyTorch user on an H100 sets it: TF32 matmuls, cuDNN autotuning
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        else:
            torch.set_num_threads(1)  # the CPU smoke shares 2 cores with the producers
        self.loaders: dict[bool, Any] = {}  # pin_ring -> its RingLoader

    def make_step(self, n_layers: int) -> Callable[[dict], Any]:
        from ringfeed.consumer.trainer.torch_example.trainer import build_model, train_step

        kwargs = self.cfg.model.kwargs | {"n_layers": n_layers}
        model, optimizer = build_model(replace(self.cfg, model={"kwargs": kwargs}), self.device)
        return lambda batch: train_step(model, optimizer, batch)

    def ringfeed(self, run_id: str, pin_ring: bool = True) -> Iterator[dict]:
        """ringfeed.torch over run `run_id`: straight from the ring pinned in place
        where CUDA allows, or (pin_ring False) through its pinned staging buffers."""
        from ringfeed.torch import RingLoader

        loader = RingLoader(self.cfg, run_id, device=self.device, pin_ring=pin_ring)
        self.loaders[pin_ring] = loader
        return every_epoch(loader)

    def dataloader(self, folder: Path, n: int, workers: int) -> Iterator[dict]:
        cuda = self.device != "cpu"
        loader = data_loader(
            self.cfg, folder, n, workers, pin=cuda, collate_fn=Collate(self.cfg, as_torch=True)
        )
        return (
            {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            for batch in forever(loader)
        )

    def resident(self, batch: dict) -> dict:
        return {k: v.clone() for k, v in batch.items()}

    def ring_pinned(self, pin_ring: bool) -> bool:
        return ring_pinned(self.loaders, pin_ring)

    def close(self) -> None:
        close_loaders(self.loaders)


class JaxFramework:
    """The JAX example model, ringfeed.jax, and the DataLoader with two batches put on
    the device ahead, on the first GPU (or the CPU)."""

    def __init__(self, cfg: Config, device: str) -> None:
        if device == "cpu":
            os.environ["JAX_PLATFORMS"] = "cpu"  # before jax starts its backends
        import jax

        from ringfeed.jax import data_parallel

        self.jax, self.cfg = jax, cfg
        self.sharding = data_parallel(jax.local_devices())
        self.replicated = jax.sharding.NamedSharding(
            self.sharding.mesh, jax.sharding.PartitionSpec()
        )
        first = jax.local_devices()[0]
        self.device_name = getattr(first, "device_kind", first.platform)
        self.loaders: dict[bool, Any] = {}  # pin_ring -> its RingLoader

    def make_step(self, n_layers: int) -> Callable[[dict], Any]:
        from ringfeed.consumer.trainer.jax_example import model
        from ringfeed.consumer.trainer.jax_example.trainer import train_step

        jax, cfg = self.jax, self.cfg
        m = default_model_kwargs(cfg.model.kwargs | {"n_layers": n_layers})
        key = jax.random.key(cfg.stager.seed)
        params = model.init(
            key,
            cfg.vocab_size,
            cfg.features.n_mels,
            cfg.data.max_speakers,
            cfg.data.max_languages,
            m,
        )
        state = [jax.device_put((params, model.adam_state(params)), self.replicated)]
        jitted = jax.jit(train_step(m, cfg.train.learning_rate), donate_argnums=(0,))

        def step(batch: dict) -> Any:
            state[0], loss = jitted(state[0], {k: batch[k] for k in INPUTS}, key)
            return loss

        return step

    def ringfeed(self, run_id: str, pin_ring: bool = True) -> Iterator[dict]:
        """ringfeed.jax over run `run_id`: straight from the ring pinned in place
        (dma_map) where the devices allow, or (pin_ring False) through a host copy."""
        from ringfeed.jax import RingLoader

        loader = RingLoader(self.cfg, run_id, sharding=self.sharding, pin_ring=pin_ring)
        self.loaders[pin_ring] = loader
        return every_epoch(loader)

    def dataloader(self, folder: Path, n: int, workers: int) -> Iterator[dict]:
        # Spawned workers: a fork of a process running JAX's threads can deadlock.
        context = "spawn" if workers else None
        loader = data_loader(
            self.cfg,
            folder,
            n,
            workers,
            pin=False,
            collate_fn=Collate(self.cfg, as_torch=False),
            multiprocessing_context=context,
        )
        return self._ahead(forever(loader), 2)

    def _ahead(self, batches: Iterator[dict], size: int) -> Iterator[dict]:
        """flax.jax_utils.prefetch_to_device's recipe: `size` batches put ahead."""
        queue: collections.deque = collections.deque()
        for batch in batches:
            queue.append(self.jax.device_put(batch, self.sharding))
            if len(queue) > size:
                yield queue.popleft()

    def resident(self, batch: dict) -> dict:
        return batch  # jax.Arrays are immutable and the step donates only its state

    def ring_pinned(self, pin_ring: bool) -> bool:
        return ring_pinned(self.loaders, pin_ring)

    def close(self) -> None:
        close_loaders(self.loaders)


def ring_pinned(loaders: dict[bool, Any], pin_ring: bool) -> bool:
    """Did the loader made with pin_ring take the ring pinned in place (after a batch)?"""
    loader = loaders.get(pin_ring)
    return loader is not None and loader.ring_pinned


def close_loaders(loaders: dict[bool, Any]) -> None:
    """Each loader's goodbye: its run ends."""
    for loader in loaders.values():
        loader.close(finished=True)


def make(name: str, cfg: Config, device: str) -> TorchFramework | JaxFramework:
    return TorchFramework(cfg, device) if name == "torch" else JaxFramework(cfg, device)
