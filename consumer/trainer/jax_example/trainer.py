"""The JAX example trainer, entry of `ringfeed trainer CONFIG --trainer jax` (what
`ringfeed run CONFIG --trainer jax` starts as the model process).

The device is chosen as the TensorFlow trainer's is, before jax is imported
(consumer/devices.py: CUDA_VISIBLE_DEVICES for this process), and the step runs
data-parallel over every device JAX then sees: ringfeed.jax's loader splits each
batch over them and the parameters are replicated, so XLA partitions one jitted
step (compiled once per length bucket) across them. On a GPU that the stager shares
(one GPU), JAX does not take 75 % of its memory up front
(XLA_PYTHON_CLIENT_PREALLOCATE=false). The model is the default TensorFlow model's
architecture in plain JAX (model.py), with Adam at train.learning_rate and a global
gradient-norm clip of 1.0. The loop, checkpoints, resume, summary and exit codes are
the example trainers' (consumer/trainer/model_loop.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ringfeed.consumer.devices import choose_device
from ringfeed.consumer.trainer.model_kwargs import default_model_kwargs
from ringfeed.shared.config import Config
from ringfeed.shared.run.process import StopFlag

if TYPE_CHECKING:
    from ringfeed.consumer.trainer.model_loop import ModelSide

log = logging.getLogger(__name__)

# As the TensorFlow trainer's (consumer/trainer/train_step.py GRAD_CLIP_NORM).
GRAD_CLIP_NORM = 1.0
# The fields the model reads; the loader places every field, the step takes these.
INPUTS = ("tokens", "text_lens", "mel", "mel_lens", "speaker", "language")


class JaxSide:
    """Parameters, optimizer state, the jitted step and the loader, on every device."""

    suffix = ".npz"

    def __init__(self, cfg: Config, run_id: str, stop: StopFlag) -> None:
        plan = choose_device("trainer", cfg)
        if plan.mode == "shared-gpu":  # the stager's process may need the GPU too
            os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        # Its INFO line about a TPU backend it did not find is no news on a GPU or CPU host.
        logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
        import jax  # only now: CUDA_VISIBLE_DEVICES is set

        from ringfeed.consumer.client.jax_loader import RingLoader, data_parallel
        from ringfeed.consumer.trainer.jax_example import model

        self.jax, self.model, self.mode = jax, model, plan.mode
        self.m = default_model_kwargs(cfg.model.kwargs)
        sharding = data_parallel(jax.local_devices())
        self.replicated = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
        self.device = f"{len(jax.local_devices())} x {jax.local_devices()[0].platform}"
        self.key = jax.random.key(cfg.stager.seed)
        params = model.init(
            self.key,
            cfg.vocab_size,
            cfg.features.n_mels,
            cfg.data.max_speakers,
            cfg.data.max_languages,
            self.m,
        )
        self.state = jax.device_put((params, model.adam_state(params)), self.replicated)
        self.n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
        self.trace_count, self.steps = 0, 0
        step = train_step(self.m, cfg.train.learning_rate, self._traced)
        self._step = jax.jit(step, donate_argnums=(0,))
        self.loader = RingLoader(cfg, run_id, sharding=sharding, stop=stop.is_set)

    def _traced(self) -> None:
        self.trace_count += 1  # called when jit traces: once per batch shape

    def step(self, batch: dict[str, Any]) -> float:
        self.steps += 1
        key = self.jax.random.fold_in(self.key, self.steps)
        self.state, loss = self._step(self.state, {k: batch[k] for k in INPUTS}, key)
        return float(loss)  # waits for the device: the true step time

    def save(self, path: Path) -> None:
        leaves = [np.asarray(leaf) for leaf in self.jax.tree.leaves(self.state)]
        with open(path, "wb") as out:  # a file: np.savez would add .npz to a path
            np.savez(out, *leaves, steps=self.steps)

    def load(self, path: Path) -> None:
        with np.load(path) as saved:
            leaves = [saved[f"arr_{k}"] for k in range(len(saved.files) - 1)]
            steps = int(saved["steps"])
        ours, treedef = self.jax.tree.flatten(self.state)
        shapes = [leaf.shape for leaf in ours]
        if [leaf.shape for leaf in leaves] != shapes:
            raise ValueError(
                f"{path} holds {len(leaves)} arrays that do not fit this model's "
                f"{len(ours)} (model.kwargs changed?)"
            )
        self.state = self.jax.device_put(self.jax.tree.unflatten(treedef, leaves), self.replicated)
        self.steps = steps

    def host(self, array: Any) -> np.ndarray:
        return np.asarray(array)


def train_step(m: Any, lr: float, on_trace: Callable[[], None] = lambda: None) -> Callable:
    """The pure step (state, batch, key) -> (state, loss) for jax.jit: the loss of
    model.kwargs `m`'s model, its gradients, one Adam step at lr (the trainer's, and
    benchmarks/gpu_feed.py's). on_trace runs each time jit traces it."""
    import jax

    from ringfeed.consumer.trainer.jax_example import model

    def step(state: tuple, batch: dict, key: Any) -> tuple[tuple, Any]:
        on_trace()
        params, opt = state

        def loss_fn(p: dict) -> Any:
            return model.masked_l1(model.forward(p, batch, key, m), batch["mel"], batch["mel_lens"])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        return model.adam(params, grads, opt, lr, GRAD_CLIP_NORM), loss

    return step


# The model side model_loop.main builds for `--trainer jax`; what it says of --worker.
# The loop's face: mypy in .ci/run proves JaxSide has what model_loop uses.
Side: type[ModelSide] = JaxSide
SEVERAL = "the JAX example trains one host; run several with jax.distributed over ringfeed.jax"
