"""Device choice: never raises without a driver; the plan for 0, 1 and 2+ GPUs."""

from __future__ import annotations

import pytest

from ringfeed.consumer import devices
from ringfeed.consumer.devices import DevicePlan, choose_device, gpu_stats, plan_device
from ringfeed.shared.config import Config, ConfigError, config_from_dict, replace


def _nvml_gpus() -> int:
    return devices.count_gpus()[0]


def test_cpu_plan_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setattr(devices, "count_gpus", lambda: (0, "NVML: Driver Not Loaded"))
    plan = choose_device("trainer", Config())
    assert plan == DevicePlan(
        "cpu", "", "no GPU found (NVML: Driver Not Loaded): running on the CPU"
    )
    assert devices.os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert gpu_stats() is None


def test_count_gpus_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    n, why = devices.count_gpus()
    assert n >= 0 and isinstance(why, str)
    if n == 0:
        assert choose_device("stager", Config()).mode == "cpu"


def test_plans_for_one_and_two_gpus() -> None:
    cfg = replace(Config(), devices={"stager_gpu": 1, "model": [0]})
    assert plan_device("stager", cfg, 2) == DevicePlan("two-gpu", "1", "stager on GPU:1 of 2")
    assert plan_device("trainer", cfg, 4).visible == "0"
    # The default model side: every GPU but the stager's, one replica each.
    many = plan_device("trainer", replace(Config(), devices={"stager_gpu": 1}), 4)
    assert (many.mode, many.visible, many.replicas) == ("multi-gpu", "0,2,3", 3)
    assert plan_device("trainer", Config(), 2).visible == "1"
    cpu = plan_device("trainer", replace(cfg, devices={"cpu_replicas": 2}), 0)
    assert (cpu.mode, cpu.replicas) == ("cpu", 2)
    with pytest.raises(ValueError, match="devices.model"):
        plan_device("trainer", replace(cfg, devices={"model": [1, 4]}), 4)
    shared = plan_device("trainer", cfg, 1)
    assert shared.mode == "shared-gpu" and shared.visible == "0"
    with pytest.raises(ValueError, match="devices.stager_gpu"):
        plan_device("stager", replace(cfg, devices={"stager_gpu": 5}), 2)


@pytest.mark.gpu
def test_tensorflow_sees_the_chosen_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if _nvml_gpus() == 0:
        pytest.skip("no GPU")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan = choose_device("trainer", Config())
    tf = pytest.importorskip("tensorflow")
    # TF may have been initialised by an earlier test in this process, before the
    # plan: then CUDA_VISIBLE_DEVICES no longer applies and it sees all GPUs.
    assert tf.config.list_physical_devices("GPU"), plan.reason
    stats = gpu_stats()
    assert stats is not None and stats["memory_total_mib"] > 0


def test_trainer_gpu_says_where_it_went() -> None:
    with pytest.raises(ConfigError, match="devices.trainer_gpu: moved to devices.model"):
        config_from_dict({"devices": {"trainer_gpu": 1}})


def test_the_stagers_gpu_probe_never_holds_up_its_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stager asks for its GPUs at its stats (consumer/stager/stager.py): a driver
    slow to answer must not stop its loop; the count comes once the probe answered."""
    import threading

    answer = threading.Event()

    def slow_count(cfg: Config) -> int:
        answer.wait(10)
        return 2

    monkeypatch.setattr(devices, "count_gpus_for", slow_count)
    probe = devices.GpuProbe(Config())
    assert probe.count() is None and probe.count() is None  # asked, not waited for
    answer.set()
    probe.thread.join(10)
    assert probe.count() == 2


def test_the_stagers_mels_run_in_the_framework_asked_or_the_first_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """devices.stager_framework names the stager's mel framework; auto takes the first of
    torch, jax, tf that imports; one that cannot be imported is named with what to
    install. (Which framework a fresh stager imports: tests/process/test_imports.py.)"""
    import os
    import sys

    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    from ringfeed.consumer.stager.jax_mel import JaxLogMel
    from ringfeed.consumer.stager.torch_mel import TorchLogMel
    from ringfeed.scripts.preflight import Finding, _devices

    monkeypatch.setattr(devices, "count_gpus", lambda: (0, "none in this test"))
    for name in ("CUDA_VISIBLE_DEVICES", "JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)  # what choose_device and JAX's set-up set

    def cfg(framework: str) -> Config:
        return replace(
            Config(), features={"device": "stager"}, devices={"stager_framework": framework}
        )

    assert devices.stager_mel_fn(Config()) is None  # features.device: producer
    torch.set_num_threads(2)
    assert isinstance(devices.stager_mel_fn(cfg("auto")), TorchLogMel)
    assert torch.get_num_threads() == 1  # on the CPU, one core for the stager's mels
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails as if not installed
    assert devices.installed_stager_framework(cfg("auto")) == "jax"
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert isinstance(devices.stager_mel_fn(cfg("auto")), JaxLogMel)
    assert os.environ["XLA_FLAGS"].endswith(f"=2 {devices.XLA_ONE_THREAD}")
    with pytest.raises(ConfigError, match=r"stager_framework: torch, .* install ringfeed\[torch\]"):
        devices.stager_mel_fn(cfg("torch"))
    monkeypatch.setitem(sys.modules, "jax", None)
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(ConfigError, match=r"none of them: install ringfeed\[torch\] \(or"):
        devices.stager_mel_fn(cfg("auto"))
    # `ringfeed validate` says so before a run starts, importing nothing.
    assert devices.installed_stager_framework(cfg("auto")) is None
    assert _devices(cfg("auto")) == [Finding(True, devices.no_stager_framework(cfg("auto")))]
