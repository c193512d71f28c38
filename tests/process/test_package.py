"""The installed package stays in its namespace: everything under `ringfeed`, so a
user's own top-level `shared` (or `scripts`, `producer`, `consumer`) is never shadowed
and never shadows ours."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.support.configs import SYNTHETIC, write_config
from tests.support.paths import REPO
from tests.support.polling import wait_for
from tests.support.runs import rid, shm_segments


def test_a_users_own_shared_package_and_ringfeed_import_side_by_side(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "__init__.py").write_text("WHO = 'the user'\n")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "__init__.py").write_text("WHO = 'the user too'\n")
    probe = (
        "import shared, scripts, ringfeed.shared.config as c, ringfeed.client as rc\n"
        "print(shared.WHO, '|', scripts.WHO, '|', c.__name__, '|', rc.load_config.__module__)\n"
        "print(rc.load_config('demo.yaml').data.path)\n"
    )
    (tmp_path / "demo.yaml").write_text("data: {path: corpus}\n")
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert (
        first == "the user | the user too | ringfeed.shared.config | ringfeed.shared.config.config"
    )
    assert second == str(tmp_path / "corpus")  # relative to the config file's folder
    cli = subprocess.run(
        [Path(sys.executable).with_name("ringfeed"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0 and "ringfeed validate CONFIG" in cli.stdout


def test_a_second_checkout_and_its_children_import_its_own_code(tmp_path: Path) -> None:
    """Another checkout (git worktree, a baseline for a benchmark) runs its own code, not
    the one the virtual environment was installed from: ringfeed/ links to its folders,
    and a process it starts gets PYTHONPATH from child_environment."""
    other = tmp_path / "other"
    for folder in ("ringfeed", "shared", "producer", "consumer", "scripts"):
        shutil.copytree(
            REPO / folder,
            other / folder,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    (other / "shared" / "config" / "marker.py").write_text("WHERE = 'other'\n")
    probe = (
        "import subprocess, sys\n"
        "from ringfeed.shared.config import environment, marker\n"
        "print(marker.WHERE, environment.code_root())\n"
        "child = 'from ringfeed.shared.config import marker; print(marker.WHERE)'\n"
        "out = subprocess.run([sys.executable, '-c', child], cwd='/', capture_output=True,\n"
        "                     text=True, env=environment.child_environment())\n"
        "print(out.stdout.strip() or out.stderr.strip()[-300:])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=other, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["other", str(other), "other"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip wheel` builds from a copy of this checkout (a build writes build/
    and egg-info beside its source), data/ included: the demos ship in it."""
    tmp = tmp_path_factory.mktemp("wheel")
    skip = (".venv", ".git", "runs", ".cache", "build", "*.egg-info", "__pycache__", "*.so")
    shutil.copytree(REPO, tmp / "src", ignore=shutil.ignore_patterns(*skip))
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp),
            str(tmp / "src"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (found,) = tmp.glob("ringfeed-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel installed, as a user's: its bin/. The
    dependencies come from this environment's site-packages through a .pth file (no
    network; a .pth there, such as a checkout's editable install, is not read)."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=180)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=180,
        env=_user_environment(),
    )
    return venv / "bin"


def _user_environment() -> dict[str, str]:
    """This environment less PYTHONPATH, which would put a checkout before the install."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package_and_the_demos(wheel: Path) -> None:
    """What `pip install ringfeed` puts into site-packages: ringfeed/ and its metadata,
    never a top-level shared/, producer/, consumer/ or scripts/; the shipped configs and
    every file of the demo corpora, which `ringfeed run` with no config trains on; the
    row pass built for this platform (shared/memory/_row_pass.c)."""
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"ringfeed", f"{'-'.join(wheel.name.split('-')[:2])}.dist-info"}, tops
    assert [
        n for n in names if n.startswith("ringfeed/shared/memory/_row_pass.") and n.endswith(".so")
    ]
    for module in (
        "shared/config/config.py",
        "producer/process/worker.py",
        "consumer/stager/stager.py",
        "consumer/client/tf_dataset.py",
        "scripts/cli.py",
        "client.py",
        "configs/demo.yaml",
    ):
        assert f"ringfeed/{module}" in names
    data = {f"ringfeed/{p.relative_to(REPO)}" for p in (REPO / "data").rglob("*") if p.is_file()}
    assert len(data) > 50 and data <= set(names), sorted(data - set(names))[:5]


@pytest.mark.slow
def test_the_wheels_metadata_puts_each_model_framework_in_its_extra(wheel: Path) -> None:
    """`pip install ringfeed` (a producer host) pulls no TensorFlow, PyTorch or JAX; the
    extras tf, torch and jax do (docs/loaders.md#installs-by-role)."""
    archive = zipfile.ZipFile(wheel)
    metadata = archive.read(next(n for n in archive.namelist() if n.endswith("/METADATA")))
    requires = [
        line.split(":", 1)[1].strip()
        for line in metadata.decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    by_extra: dict[str, set[str]] = {}
    for requirement in requires:
        extra = (
            requirement.split("extra ==", 1)[1].strip(" '\"") if "extra ==" in requirement else ""
        )
        name = requirement.replace(" ", "").split(";")[0]
        by_extra.setdefault(extra, set()).add(name.split(">")[0].split("=")[0].lower())
    frameworks = {"tensorflow", "keras", "tensorboard", "torch", "jax", "jaxlib"}
    assert by_extra[""].isdisjoint(frameworks), by_extra[""] & frameworks
    assert {"tensorflow", "tensorboard"} <= by_extra["tf"]
    assert by_extra["torch"] == {"torch"} and by_extra["jax"] == {"jax"}


@pytest.mark.slow
def test_an_installed_wheel_finds_its_demos(installed: Path, tmp_path: Path) -> None:
    """validate, from the install and another directory, reads each shipped config's
    corpus from the package: every clip usable by its header."""
    where = "import ringfeed; print(ringfeed.__file__)"
    found = subprocess.run(
        [installed / "python", "-c", where],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        env=_user_environment(),
        check=True,
    )
    package = Path(found.stdout.strip()).parent
    assert not package.is_relative_to(REPO), package  # the wheel's code, not this checkout's
    for config, clips in (("demo.yaml", 16), ("multilingual.yaml", 40)):
        argv = [installed / "ringfeed", "validate", str(package / "configs" / config)]
        out = subprocess.run(
            argv, cwd=tmp_path, capture_output=True, text=True, timeout=180, env=_user_environment()
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"usable        {clips} of {clips} clips" in out.stdout, out.stdout


@pytest.mark.slow
def test_an_installed_wheel_prints_a_resume_command_that_resumes(
    installed: Path, tmp_path: Path
) -> None:
    """A stopped run says how to resume it; in an install (no scripts/launch.sh) that
    command is the install's own `ringfeed run`, and pasted elsewhere it resumes the run."""
    raw = {**SYNTHETIC, "ring": {"heartbeat_s": 0.1}}
    config = write_config(tmp_path, raw)
    run_id = rid("wheel")
    argv = [installed / "ringfeed", "run", str(config), "--run-id", run_id, "--consumer", "drain"]
    first = subprocess.Popen(
        argv,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_user_environment(),
    )
    try:
        wait_for(lambda: shm_segments(run_id), 120, "the run's rings")
    finally:
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, out + err
    line = next(line for line in err.splitlines() if "resume it with:" in line)
    printed = line.split("resume it with: ", 1)[1]
    assert shlex.split(printed)[3:6] == [str(installed / "ringfeed"), "run", str(config)], printed
    # Pasted from another directory, it resumes the same run: one epoch, drained, then done.
    config.write_text(
        yaml.safe_dump(
            {**raw, "stager": {**raw["stager"], "epochs": 1}, "run_root": str(tmp_path / "runs")}
        )
    )
    again = subprocess.run(
        ["bash", "-c", printed],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=180,
        env=_user_environment(),
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"run {run_id} with {config}" in again.stdout and "this run resumes" in again.stdout
    assert f"drained {32 // 4} batches" in again.stdout + again.stderr
    assert shm_segments(run_id) == []
