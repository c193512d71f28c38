"""The PyTorch example trainer, entry of `ringfeed trainer CONFIG --trainer torch` (what
`ringfeed run CONFIG --trainer torch` starts as the model process).

The device is chosen as the TensorFlow trainer's is, before torch is imported
(consumer/devices.py: CUDA_VISIBLE_DEVICES for this process): the first of the model's
GPUs, or the CPU with train.cpu_threads threads. The model is the default TensorFlow
model's architecture (model.py), trained with Adam at train.learning_rate and the
gradients clipped to a global norm of 1.0; the batches come from ringfeed.torch's
loader. The entry, loop, checkpoints, resume, summary and exit codes are the example
trainers' (consumer/trainer/model_loop.py main). One worker: several are a torchrun
of your own over the loader (docs/loaders.md#several-gpus).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ringfeed.consumer.devices import choose_device
from ringfeed.consumer.trainer.model_kwargs import default_model_kwargs
from ringfeed.consumer.trainer.trainer import cpu_threads
from ringfeed.shared.config import Config
from ringfeed.shared.run.process import StopFlag

if TYPE_CHECKING:
    from ringfeed.consumer.trainer.model_loop import ModelSide

log = logging.getLogger(__name__)

# As the TensorFlow trainer's (consumer/trainer/train_step.py GRAD_CLIP_NORM).
GRAD_CLIP_NORM = 1.0
# The fields the model reads; the loader places every field, the step uses these.
INPUTS = ("tokens", "text_lens", "mel", "mel_lens", "speaker", "language")


class TorchSide:
    """The model, its optimizer and the loader, on the device chosen for this process."""

    suffix = ".pt"

    def __init__(self, cfg: Config, run_id: str, stop: StopFlag) -> None:
        plan = choose_device("trainer", cfg)
        import torch  # only now: CUDA_VISIBLE_DEVICES is set

        from ringfeed.consumer.client.torch_loader import RingLoader

        self.torch, self.mode = torch, plan.mode
        if plan.mode == "cpu":
            torch.set_num_threads(cpu_threads(cfg, os.cpu_count() or 1))
        elif plan.replicas > 1:
            log.warning(
                "the PyTorch example trains on one GPU (cuda:0 of %s); several are a "
                "torchrun of your own over ringfeed.torch",
                plan.visible,
            )
        self.device = "cpu" if plan.mode == "cpu" else "cuda:0"
        torch.manual_seed(cfg.stager.seed)
        self.model, self.optimizer = build_model(cfg, self.device)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.loader = RingLoader(cfg, run_id, device=self.device, stop=stop.is_set)
        self.shapes: set[tuple[int, ...]] = set()

    @property
    def trace_count(self) -> int:
        """Batch shapes seen: eager PyTorch compiles nothing, but cuDNN picks its
        algorithms once per shape, so a new shape's step is timed apart as XLA's is."""
        return len(self.shapes)

    def step(self, batch: dict[str, Any]) -> float:
        self.shapes.add(tuple(batch["mel"].shape))
        loss = train_step(self.model, self.optimizer, batch)
        return float(loss)  # waits for the device: the true step time

    def save(self, path: Path) -> None:
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        self.torch.save(state, path)

    def load(self, path: Path) -> None:
        state = self.torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])  # raises when the model changed
        self.optimizer.load_state_dict(state["optimizer"])

    def host(self, array: Any) -> np.ndarray:
        return array.cpu().numpy()


def build_model(cfg: Config, device: str) -> tuple[Any, Any]:
    """(model, optimizer) on device: TorchTTS of cfg's model.kwargs, Adam at
    train.learning_rate (the trainer's, and benchmarks/gpu_feed.py's)."""
    import torch

    from ringfeed.consumer.trainer.torch_example.model import TorchTTS

    m = default_model_kwargs(cfg.model.kwargs)
    model = TorchTTS(
        cfg.vocab_size,
        cfg.features.n_mels,
        cfg.text.max_text_len,
        cfg.features.max_frames,
        cfg.data.max_speakers,
        cfg.data.max_languages,
        m,
    ).to(device)
    return model, torch.optim.Adam(model.parameters(), lr=cfg.train.learning_rate)


def train_step(model: Any, optimizer: Any, batch: dict[str, Any]) -> Any:
    """One optimizer step on a batch of tensors on the model's device; -> the loss, a
    tensor not yet waited for."""
    import torch

    from ringfeed.consumer.trainer.torch_example.model import masked_l1

    model.train()
    pred = model({name: batch[name] for name in INPUTS})
    loss = masked_l1(pred, batch["mel"], batch["mel_lens"])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP_NORM)
    optimizer.step()
    return loss.detach()


# The model side model_loop.main builds for `--trainer torch`; what it says of --worker.
# The loop's face: mypy in .ci/run proves TorchSide has what model_loop uses.
Side: type[ModelSide] = TorchSide
SEVERAL = "the PyTorch example trains one worker; run several with torchrun over ringfeed.torch"
