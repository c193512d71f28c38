"""Device choice for the stager and the trainer, made before a framework is imported.

Each consumer process calls :func:`choose_device` first thing, before any
``import tensorflow`` (torch, jax): a framework reads CUDA_VISIBLE_DEVICES once, when
it initialises CUDA, so setting it later does nothing. GPUs are counted with NVML
(``pynvml``), which needs only the driver, not a framework. The stager's mels
(features.device: stager) run in the framework :func:`stager_mel_fn` imports after
that, on the GPU the plan gives the stager or on the CPU.

    2+ GPUs -> stager on devices.stager_gpu, trainer on devices.model: one
               replica per GPU (MirroredStrategy); default every GPU but the
               stager's, so on N GPUs the model has N - 1 replicas
    1 GPU   -> both processes share GPU 0; memory growth keeps the first from
               reserving all of it (configure_tensorflow)
    0 GPUs  -> CUDA_VISIBLE_DEVICES="" and both run on the CPU, the path CI takes;
               devices.cpu_replicas > 1 splits the CPU into that many logical
               devices, one replica each (how tests and benchmarks run
               MirroredStrategy without a GPU)

Nothing here raises when there is no driver: a machine without NVML is a CPU
machine.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ringfeed.shared.config import Config, ConfigError
from ringfeed.shared.config.environment import (
    cuda_visible_devices,
    tensorflow_log_level,
    xla_flags,
)

if TYPE_CHECKING:
    from ringfeed.consumer.stager.gpu_mel import BatchLogMel

log = logging.getLogger(__name__)

Role = Literal["stager", "trainer"]

# What `import tensorflow` imports when it is installed although no ringfeed process uses
# it: tf.lite imports JAX (for a converter), Keras's estimator wrappers scikit-learn (a
# librosa dependency) and its image gallery matplotlib. Each is a `try: import ... except
# ImportError` in TensorFlow and Keras. With ringfeed[jax] installed beside ringfeed[tf]
# they were a third of the import: 4.9 s of CPU down to 3.3 s, in every trainer process.
NOT_FOR_TENSORFLOW = ("jax", "matplotlib", "sklearn")
# The frameworks the stager's batch mels run in, in the order devices.stager_framework:
# auto tries them. torch first: eager, nothing compiled at a bucket's first batch (JAX
# compiles each bucket's shape once, 0.4 s of a 2-core CPU for [32, 800 x 256]); then
# JAX; TensorFlow last (its import and set-up took 1.9 s here, torch's 1.0, JAX's 0.35).
STAGER_FRAMEWORKS = ("torch", "jax", "tf")
# XLA's CPU client on one thread (read when JAX starts its backend).
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
# The modules whose absence means a framework is not installed (ModuleNotFoundError.name).
FRAMEWORK_MODULES = {"torch": ("torch",), "jax": ("jax", "jaxlib"), "tf": ("tensorflow", "keras")}


@dataclass(frozen=True)
class DevicePlan:
    """Where one consumer process runs.

    mode: "two-gpu", "multi-gpu" (the model on several), "shared-gpu" or "cpu";
    visible: the CUDA_VISIBLE_DEVICES value set for this process ("" = CPU);
    reason: one plain sentence for the log; replicas: model replicas in this process.
    """

    mode: Literal["two-gpu", "multi-gpu", "shared-gpu", "cpu"]
    visible: str
    reason: str
    replicas: int = 1


@functools.cache
def count_gpus() -> tuple[int, str]:
    """Number of GPUs the driver sees and, when 0, why (for the log). Never raises. Asked
    once a process: a failed probe (no driver) costs ~30 ms of a stager's start."""
    try:
        import pynvml
    except ImportError as exc:
        return 0, f"pynvml not installed: {exc}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return 0, f"NVML: {exc}"
    try:
        return int(pynvml.nvmlDeviceGetCount()), "NVML"
    except pynvml.NVMLError as exc:
        return 0, f"NVML: {exc}"
    finally:
        _nvml_shutdown()


def count_gpus_for(cfg: Config) -> int:
    """count_gpus, and a warning when features.device: stager has no GPU to run on."""
    n, why = count_gpus()
    if n == 0 and cfg.features.device == "stager":
        log.warning(
            "features.device: stager on a host without GPU (%s): stager-side mels "
            "run on the CPU, in the stager alone, at about 2x the CPU of producer mels",
            why,
        )
    return n


class GpuProbe:
    """count_gpus_for in a thread of its own, started at the first ask: a driver that is
    slow to answer (NVML's init takes seconds on a GPU without persistence mode) or
    never answers does not hold up the stager's loop, and a host with no driver pays
    its ~30 ms failed probe after the first batches, not before the first grant.
    count() is None until the probe has answered."""

    def __init__(self, cfg: Config) -> None:
        self.cfg, self.answer = cfg, None
        self.thread: threading.Thread | None = None

    def count(self) -> int | None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._probe, name="gpu-probe", daemon=True)
            self.thread.start()
        return self.answer

    def _probe(self) -> None:
        self.answer = count_gpus_for(self.cfg)


def stager_mel_fn(cfg: Config) -> BatchLogMel | None:
    """The stager's batch log-mel (consumer/stager/gpu_mel.py) on its device with
    features.device: stager, else None: in devices.stager_framework, or with auto the
    first of STAGER_FRAMEWORKS this host can import. Only this imports a framework in
    the stager, after its device is chosen, and only the one the mels run in; a
    ConfigError says what to install when there is none.

    On the CPU the mels run on one thread in every framework, as each producer's math
    does: the cores are the producers' and the trainer's. torch's default pool (one
    thread a core) took 1.1-4.5 s for a [32, 800 x 256] batch on this 2-core machine at
    load 6, one thread 0.16-0.3 s; JAX's and TensorFlow's pools cost less there (0.19
    and 0.29 s against 0.13 and 0.17-0.23 on one thread) but did not help either."""
    if cfg.features.device != "stager":
        return None
    plan = choose_device("stager", cfg)
    wanted = cfg.devices.stager_framework
    for framework in STAGER_FRAMEWORKS if wanted == "auto" else (wanted,):
        try:
            mel_fn = _STAGER_MELS[framework](cfg, plan)
        except ModuleNotFoundError as exc:
            if exc.name not in FRAMEWORK_MODULES[framework]:
                raise
            continue  # not installed here: the next one, or the error below
        log.info("the stager's mels run in %s", framework)
        return mel_fn
    raise ConfigError(no_stager_framework(cfg))


def installed_stager_framework(cfg: Config) -> str | None:
    """The framework stager_mel_fn would build the mels in, as far as this host's
    packages say without importing any (`ringfeed validate`); None: none is installed."""
    wanted = cfg.devices.stager_framework
    for framework in STAGER_FRAMEWORKS if wanted == "auto" else (wanted,):
        if all(importlib.util.find_spec(m) is not None for m in FRAMEWORK_MODULES[framework]):
            return framework
    return None


def no_stager_framework(cfg: Config) -> str:
    """What to do when devices.stager_framework finds nothing to import on this host."""
    wanted = cfg.devices.stager_framework
    if wanted == "auto":
        return (
            "features.device: stager computes the batches' mels with torch, JAX or "
            "TensorFlow, and this host has none of them: install ringfeed[torch] (or "
            "[jax], [tf]) here, or set features.device: producer (docs/loaders.md#devices)"
        )
    return (
        f"devices.stager_framework: {wanted}, which this host cannot import: install "
        f"ringfeed[{wanted}] here, or set devices.stager_framework: auto (the first of "
        f"{', '.join(STAGER_FRAMEWORKS)} installed) or features.device: producer "
        "(docs/loaders.md#devices)"
    )


def _torch_mels(cfg: Config, plan: DevicePlan) -> BatchLogMel:
    import torch

    from ringfeed.consumer.stager.torch_mel import TorchLogMel

    gpu = plan.mode != "cpu" and torch.cuda.is_available()
    if plan.mode != "cpu" and not gpu:
        log.warning("torch %s has no CUDA: the stager's mels run on the CPU", torch.__version__)
    if not gpu:
        torch.set_num_threads(1)  # one core: stager_mel_fn
    return TorchLogMel(cfg, "cuda" if gpu else "cpu")


def _jax_mels(cfg: Config, plan: DevicePlan) -> BatchLogMel:
    if plan.mode == "cpu":  # no probe for a GPU or TPU plugin it would not find
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["XLA_FLAGS"] = f"{xla_flags()} {XLA_ONE_THREAD}".strip()  # stager_mel_fn
    else:  # not 75 % of the GPU up front: the mels take well under 1 GB of it
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    # Its INFO line about a TPU backend it did not find is no news on a GPU or CPU host.
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    import jax

    from ringfeed.consumer.stager.jax_mel import JaxLogMel

    device = jax.devices()[0]
    if plan.mode != "cpu" and device.platform == "cpu":
        log.warning("JAX %s has no GPU here: the stager's mels run on the CPU", jax.__version__)
    return JaxLogMel(cfg, device)


def _tf_mels(cfg: Config, plan: DevicePlan) -> BatchLogMel:
    tf = import_tensorflow()
    from ringfeed.consumer.stager.tf_mel import TfLogMel

    configure_tensorflow(plan)
    if plan.mode == "cpu":  # one core: stager_mel_fn
        with contextlib.suppress(RuntimeError):  # pools already made: an op ran before us
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(1)
    return TfLogMel(cfg)


# Build the stager's mels in each framework (after choose_device), by its name.
_STAGER_MELS: dict[str, Callable[[Config, DevicePlan], BatchLogMel]] = {
    "torch": _torch_mels,
    "jax": _jax_mels,
    "tf": _tf_mels,
}


def _nvml_shutdown() -> None:
    import pynvml

    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass  # shutting down a half-initialised NVML has nothing left to release


def plan_device(role: Role, cfg: Config, n_gpus: int, why: str = "") -> DevicePlan:
    """The plan for `role` given `n_gpus`; pure, so tests need no driver."""
    if role not in ("stager", "trainer"):
        raise ValueError(f"role must be 'stager' or 'trainer', got {role!r}")
    if n_gpus <= 0:
        detail = f" ({why})" if why else ""
        replicas = cfg.devices.cpu_replicas if role == "trainer" else 1
        many = f", {replicas} replicas (devices.cpu_replicas)" if replicas > 1 else ""
        return DevicePlan("cpu", "", f"no GPU found{detail}: running on the CPU{many}", replicas)
    if n_gpus == 1:
        return DevicePlan("shared-gpu", "0", f"{role} on GPU:0, shared (1 GPU found)")
    stager = cfg.devices.stager_gpu
    gpus = [stager] if role == "stager" else list(cfg.devices.model)
    key = "devices.stager_gpu" if role == "stager" else "devices.model"
    if not gpus:
        gpus = [g for g in range(n_gpus) if g != stager]
    if not all(0 <= g < n_gpus for g in gpus):
        raise ValueError(f"{key}={gpus} but only {n_gpus} GPUs are visible: use GPUs < {n_gpus}")
    names = ",".join(f"GPU:{g}" for g in gpus)
    if len(gpus) == 1:
        return DevicePlan("two-gpu", str(gpus[0]), f"{role} on {names} of {n_gpus}")
    reason = f"{role} on {names} of {n_gpus}: {len(gpus)} replicas, stager on GPU:{stager}"
    return DevicePlan("multi-gpu", ",".join(map(str, gpus)), reason, len(gpus))


def quiet_tensorflow() -> int:
    """Set TF_CPP_MIN_LOG_LEVEL for this process before TensorFlow is imported (it reads
    the variable once, at import): errors only, and with no GPU not even its failed CUDA
    probe ("failed call to cuInit"), which a CPU run expects. Returns the GPUs found."""
    n_gpus, _ = count_gpus()
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = tensorflow_log_level(has_gpu=n_gpus > 0)
    return n_gpus


def choose_device(role: Role, cfg: Config) -> DevicePlan:
    """Pick this process's device and set CUDA_VISIBLE_DEVICES; call before importing TF.

    Called once by the stager and the trainer process at start. An existing
    CUDA_VISIBLE_DEVICES narrows what NVML's indices mean, so it is logged.
    """
    n_gpus, why = count_gpus()
    plan = plan_device(role, cfg, n_gpus, why)
    inherited = cuda_visible_devices()
    if inherited is not None and inherited != plan.visible:
        log.info(
            "CUDA_VISIBLE_DEVICES was %r; setting %r for the %s", inherited, plan.visible, role
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = plan.visible
    # TensorFlow's C++ INFO lines drown ours. The few it prints before absl logging is
    # initialised ignore this (abseil-cpp PR 1957); the XLA and device chatter obeys it.
    # Without a GPU, its CUDA probe's error ("failed call to cuInit") is no error of ours.
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = tensorflow_log_level(has_gpu=n_gpus > 0)
    log.info("%s", plan.reason)
    return plan


def import_tensorflow() -> Any:
    """`import tensorflow` for a process ringfeed starts (the trainer, the stager's mels),
    with NOT_FOR_TENSORFLOW hidden during the import alone: the process imports them
    later as usual, and only Keras's scikit-learn wrappers and image gallery, which
    ringfeed never calls, stay without them. Call after choose_device."""
    if sys.modules.get("tensorflow") is not None:  # None: blocked, `import` raises
        return sys.modules["tensorflow"]
    hidden = [name for name in NOT_FOR_TENSORFLOW if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden))  # None: `import name` raises ImportError
    try:
        import tensorflow as tf
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return tf


def configure_tensorflow(plan: DevicePlan) -> None:
    """After `import tensorflow`: memory growth on a shared GPU so both processes fit;
    on the CPU with several replicas, that many logical CPU devices."""
    import tensorflow as tf

    if plan.mode == "cpu" and plan.replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        logical = [tf.config.LogicalDeviceConfiguration()] * plan.replicas
        tf.config.set_logical_device_configuration(cpu, logical)
    if plan.mode != "shared-gpu":
        return
    for gpu in tf.config.list_physical_devices("GPU"):
        # Without growth the first process to start takes ~all GPU memory and the
        # second fails with an out-of-memory error at its first op.
        tf.config.experimental.set_memory_growth(gpu, True)


def gpu_stats() -> dict[str, Any] | None:
    """Utilization % and memory MiB of this process's visible GPU, or None without one.

    Called by the trainer's metrics every log interval. Reads NVML, so it costs
    ~1 ms and does not touch TensorFlow.
    """
    index = _visible_index()
    if index is None:
        return None
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            "gpu_index": index,
            "utilization_pct": float(util.gpu),
            "memory_used_mib": mem.used / 2**20,
            "memory_total_mib": mem.total / 2**20,
        }
    except pynvml.NVMLError as exc:
        log.debug("NVML query failed: %s", exc)
        return None
    finally:
        _nvml_shutdown()


def _visible_index() -> int | None:
    """NVML index of the first GPU in CUDA_VISIBLE_DEVICES; None when it hides all GPUs."""
    visible = cuda_visible_devices()
    if visible is None:
        return 0  # nothing hidden: the process sees GPU 0 first
    first = visible.split(",")[0].strip()
    if not first.isdigit():
        return None  # "" (CPU), "-1" or a UUID we do not map
    return int(first)
