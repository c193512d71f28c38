"""The configuration's model sections: the model (model), its training (train) and the
devices it runs on (devices). Part of the one configuration (shared/config/config.py);
each validates its own keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ringfeed.shared.config.loader import at_least_one, check


@dataclass(frozen=True)
class ModelConfig:
    # "module:function", called as function(cfg, **kwargs) by the trainer (the default:
    # consumer/trainer/model_kwargs.py DEFAULT_FACTORY).
    factory: str = "ringfeed.consumer.trainer.model:build_default_model"
    # The factory's own hyper-parameters; it checks them (the default model's:
    # d_model, n_layers, kernel_size, dropout, consumer/trainer/model.py).
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainConfig:
    # Training steps of a run (a resume counts from its checkpoint).
    steps: int = 300
    # Adam's learning rate.
    learning_rate: float = 1e-3
    # Steps between checkpoints (SIGTERM and Ctrl-C also save one).
    checkpoint_every: int = 100
    # Steps between loss lines in the log.
    log_every: int = 10
    # float16 compute on a GPU (ignored on the CPU).
    mixed_precision: bool = True
    # Compile the train step with XLA (one program per batch shape).
    jit_compile: bool = True
    # Append each step's batch item ids to run_dir/batches.jsonl (resume tests, audits).
    log_batches: bool = False
    # TF intra-op threads of a CPU trainer; 0: every core (docs/running.md#the-cpu-trainer).
    cpu_threads: int = 0
    collective_timeout_s: float = 120.0  # --worker K/N: longest wait on a peer, then exit 1
    # Longest a consumer (the trainer, ring_dataset) waits for the stager's WELCOME, s.
    connect_timeout_s: float = 60.0
    # Longest a consumer waits for a batch before it ends, saying whether the stager is
    # alive (it warns every minute meanwhile), seconds: the first batch of a cold cache
    # on slow producers is the worst case.
    data_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        at_least_one("train", log_every=self.log_every, checkpoint_every=self.checkpoint_every)
        check(self.steps >= 0, "train.steps", "must be >= 0")
        check(self.cpu_threads >= 0, "train.cpu_threads", "must be >= 0 (0 = every core)")
        check(self.collective_timeout_s > 0, "train.collective_timeout_s", "must be > 0")
        for key in ("connect_timeout_s", "data_timeout_s"):
            check(getattr(self, key) > 0, f"train.{key}", "must be > 0")


@dataclass(frozen=True)
class DevicesConfig:
    # The stager's GPU (with two or more GPUs).
    stager_gpu: int = 0
    model: tuple[int, ...] = ()  # the model's GPUs, a replica each; (): all but stager_gpu
    cpu_replicas: int = 1  # model replicas without a GPU: logical CPU devices
    # The framework of the stager's batch mels (features.device: stager), on its GPU or
    # the CPU: auto takes the first of torch, jax, tf the host has installed.
    stager_framework: Literal["auto", "torch", "jax", "tf"] = "auto"

    def __post_init__(self) -> None:
        check(self.cpu_replicas >= 1, "devices.cpu_replicas", "must be >= 1")
        model = self.model
        check(
            len(set(model)) == len(model) and all(g >= 0 for g in model),
            "devices.model",
            f"must list distinct GPU indices >= 0, got {list(model)}",
        )
