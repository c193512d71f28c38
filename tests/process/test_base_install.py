"""Installs by role (docs/loaders.md#installs-by-role): the base package is what producers
and the stager need, without TensorFlow, PyTorch or JAX; each model side is an extra.
Its metadata says so, and a whole run of the base's processes (launcher, validate,
stager, producers, a batch consumer) works in interpreters where those frameworks
cannot be imported; stager-side mels, which need torch, JAX or TensorFlow, say what to
install."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
import uuid
from pathlib import Path

import pytest

from tests.support.configs import small
from tests.support.paths import REPO
from tests.support.processes import CLI
from tests.support.runs import shm_segments

FRAMEWORKS = ("tensorflow", "keras", "tensorboard", "torch", "jax", "jaxlib")


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_base_package_needs_no_model_framework_and_each_side_is_an_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert requirement_names(project["dependencies"]).isdisjoint(FRAMEWORKS)
    extras = project["optional-dependencies"]
    assert {"tensorflow", "tensorboard"} <= requirement_names(extras["tf"])
    assert requirement_names(extras["torch"]) == {"torch"}
    assert requirement_names(extras["jax"]) == {"jax"}
    # What only some roles use is an extra too, named when a config needs it
    # (shared/config/extras.py); the tests install them with dev.
    roles = {"parquet": {"pyarrow"}, "s3": {"s3fs"}, "plot": {"matplotlib"}}
    for extra, names in roles.items():
        assert requirement_names(extras[extra]) == names
        assert requirement_names(project["dependencies"]).isdisjoint(names)
    assert "ringfeed[parquet,s3,plot]" in extras["dev"]
    assert "==" not in extras["torch"][0], "a user's CUDA build is theirs: pin in setup.sh only"
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "'.[dev,ray,tf]'" in setup, "the README's set-up still installs TensorFlow"
    assert "torch==2.13.0 -e '.[torch]'" in setup and "-e '.[jax]'" in setup


def without_frameworks(tmp_path: Path) -> dict[str, str]:
    """An environment whose interpreters cannot import any model framework: a folder of
    stand-ins first on PYTHONPATH, each raising what a missing module raises."""
    blocked = tmp_path / "blocked"
    for name in FRAMEWORKS:
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(
            f'raise ModuleNotFoundError("No module named {name!r} (blocked)", name={name!r})\n'
        )
    path = os.pathsep.join([str(blocked), os.environ.get("PYTHONPATH", "")])
    return os.environ | {"PYTHONPATH": path}


@pytest.mark.slow
def test_a_run_of_the_base_install_imports_no_model_framework(tmp_path: Path) -> None:
    env = without_frameworks(tmp_path)
    probe = subprocess.run(
        [*CLI[:1], "-c", "import tensorflow"], env=env, capture_output=True, text=True, timeout=60
    )
    assert "No module named 'tensorflow' (blocked)" in probe.stderr, probe.stderr
    n, run_id = 40, f"base-{uuid.uuid4().hex[:6]}"
    config = small(tmp_path, items=n, delay_s=0.0)
    argv = [*CLI, "run", str(config), "--run-id", run_id, "--consumer", "drain"]
    run = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert f"drained {n // 8} batches of 8" in out and "blocked" not in out, out
    assert shm_segments(run_id) == []


@pytest.mark.slow
def test_stager_side_mels_without_a_framework_say_what_to_install(tmp_path: Path) -> None:
    config = small(tmp_path, features={"device": "stager"})
    argv = [*CLI, "stager", str(config), "--run-id", f"base-{uuid.uuid4().hex[:6]}"]
    stager = subprocess.run(
        argv, cwd=REPO, env=without_frameworks(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert stager.returncode == 2, stager.stderr
    assert "none of them: install ringfeed[torch] (or [jax], [tf]) here" in stager.stderr
    assert "or set features.device: producer" in stager.stderr
