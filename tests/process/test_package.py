"""The installed package stays in its namespace: everything under `ringfeed`, so a
user's own top-level `shared` (or `scripts`, `producer`, `consumer`) is never shadowed
and never shadows ours."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import REPO


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
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert (
        first == "the user | the user too | ringfeed.shared.config | ringfeed.shared.config.config"
    )
    assert second == str(tmp_path / "corpus")  # relative to the config file's folder
    cli = subprocess.run([Path(sys.executable).with_name("ringfeed"), "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cli.returncode == 0 and "ringfeed validate CONFIG" in cli.stdout


def test_a_second_checkout_and_its_children_import_its_own_code(tmp_path: Path) -> None:
    """Another checkout (git worktree, a baseline for a benchmark) runs its own code, not
    the one the virtual environment was installed from: ringfeed/ links to its folders,
    and a process it starts gets PYTHONPATH from child_environment."""
    other = tmp_path / "other"
    for folder in ("ringfeed", "shared", "producer", "consumer", "scripts"):
        shutil.copytree(REPO / folder, other / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
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
    out = subprocess.run([sys.executable, "-c", probe], cwd=other, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["other", str(other), "other"]


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package(tmp_path: Path) -> None:
    """What `pip install ringfeed` puts into site-packages: ringfeed/ and its metadata,
    never a top-level shared/, producer/, consumer/ or scripts/."""
    source = tmp_path / "src"  # a copy: a build writes build/ and egg-info beside it
    skip = (".venv", ".git", "runs", ".cache", "build", "*.egg-info", "__pycache__", "data")
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*skip))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("ringfeed-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"ringfeed", f"{wheel.name.split('-py')[0]}.dist-info"}, tops
    for module in ("shared/config/config.py", "producer/worker.py", "consumer/stager/stager.py",
                   "consumer/client/tf_dataset.py", "scripts/cli.py", "client.py",
                   "configs/demo.yaml"):  # fmt: skip
        assert f"ringfeed/{module}" in names
