"""Fixtures shared by the test modules (helpers that are plain functions live in
tests/support/, one module per concern)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest

from ringfeed.shared.config.environment import child_environment, code_root
from ringfeed.shared.memory.segments import list_segments

# Every process a test starts runs this checkout's code, whatever its working directory
# and however it is started (the editable install maps `ringfeed` to the checkout it was
# installed from, which may be another worktree).
os.environ["PYTHONPATH"] = child_environment()["PYTHONPATH"]
# JAX on the CPU (the JAX loader's and trainer's tests, here and in the processes they
# start): two host devices, so the default data-parallel sharding really splits a batch,
# and one thread each, as the 2 cores are shared. Read once, when JAX starts its backend.
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false "
    "intra_op_parallelism_threads=1",
)
# The per-user cache (features.cache_dir's default: the corpus index, feature and text
# caches, the FFT choice) is this checkout's, as when it was the working directory's:
# tests of several checkouts on one host never read each other's caches.
os.environ["XDG_CACHE_HOME"] = str(code_root() / ".cache")


@pytest.fixture(scope="session")
def tf_single_threaded() -> None:
    """TensorFlow in the test process runs each op on one thread, and one op at a time:
    the 2 cores are shared with the producers and stagers that other tests start.

    TF fixes its thread pools at its first op, so every module that runs TF ops asks
    for this fixture (``pytestmark = pytest.mark.usefixtures("tf_single_threaded")``)."""
    tf = pytest.importorskip("tensorflow")
    with contextlib.suppress(RuntimeError):  # pools already made: an op ran before us
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(1)


@pytest.fixture
def run_id() -> Iterator[str]:
    """A fresh run id for a test that makes segments itself (the ring's tests): any
    segment of it left behind fails the test."""
    rid = f"test-{uuid.uuid4().hex[:8]}"
    yield rid
    for path in list_segments(rid):
        path.unlink()
        pytest.fail(f"test left {path} behind")


def pytest_terminal_summary(terminalreporter, exitstatus: int) -> None:
    """The layout report (tests/support/layout.py): how long the longest files and
    functions are, printed, never a gate."""
    from tests.support.layout import report

    terminalreporter.section("layout")
    for line in report():
        terminalreporter.write_line(line)
