"""What a fresh process imports: producers, the stager's default path and the inspector
never import a model framework (TensorFlow: 3-5 s and ~600 MB per process), only the
trainer and stager-side mels do, and those only the one they run in; the producers'
features never import librosa; a start leaves out what only later work needs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import REPO


def test_cpu_side_modules_leave_every_framework_unimported() -> None:
    code = (
        "import sys\n"
        "import ringfeed.producer.process.pool, ringfeed.producer.process.worker\n"
        "import ringfeed.producer.pipeline\n"
        "import ringfeed.consumer.stager.stager, ringfeed.consumer.tools.inspector\n"
        "import ringfeed.consumer.client.batch_client, ringfeed.scripts.cli\n"
        "import ringfeed.consumer.devices, ringfeed.consumer.stager.gpu_mel\n"
        f"sys.exit(str([m for m in {FRAMEWORKS!r} if m in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.stderr.strip() == "[]", out.stderr


# The model frameworks a process may import, by devices.stager_framework's names.
FRAMEWORKS = {"torch": "torch", "jax": "jax", "tf": "tensorflow"}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_stagers_mels_import_only_their_own_framework(framework: str) -> None:
    """A stager with features.device: stager imports the framework its mels run in and
    neither of the others, nor librosa (its window and filterbank are
    shared/sample/mel_definition.py's)."""
    pytest.importorskip(FRAMEWORKS[framework])
    code = (
        "import sys\n"
        "from ringfeed.shared.config import Config, replace\n"
        "from ringfeed.consumer.devices import stager_mel_fn\n"
        "cfg = replace(Config(), features={'device': 'stager'}, "
        f"devices={{'stager_framework': {framework!r}}})\n"
        f"assert stager_mel_fn(cfg).framework == {framework!r}\n"
        "print([m for m in ('torch', 'jax', 'tensorflow', 'librosa') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str([FRAMEWORKS[framework]]), out.stdout


def test_producer_features_never_import_librosa() -> None:
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from ringfeed.shared.config import Config\n"
        "from ringfeed.producer.features.mel import log_mel\n"
        "log_mel(np.zeros(22050, np.float32), Config())\n"
        "sys.exit('librosa' in sys.modules)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60).returncode == 0


def test_a_producer_reading_its_hosts_fft_choice_never_imports_scipy(tmp_path) -> None:
    """The FFT library is timed once per host and kept (producer/features/fft.py): a producer that
    reads the choice pays no scipy.fft import (0.5 s of CPU) before its first grant."""
    from ringfeed.producer.features import fft

    path = fft.choice_path(1024, str(tmp_path))
    path.parent.mkdir(parents=True)
    path.write_text('{"name": "ducc0"}')
    code = (
        "import sys, numpy as np\n"
        "from ringfeed.shared.config import Config, replace\n"
        "from ringfeed.producer.features.mel import log_mel\n"
        f"cfg = replace(Config(), features={{'cache_dir': {str(tmp_path)!r}}})\n"
        "log_mel(np.zeros(22050, np.float32), cfg)\n"
        "sys.exit('scipy' in sys.modules)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60).returncode == 0


# Imported only by the work that needs them, not at every start (each one's cost at
# every run's first batch, benchmarks/first_batch.py): numpy.ma (np.median's first call,
# ~14 ms), pynvml (asked at the stager's first stats), num2words (~35 ms; a warm start's
# texts come from the text cache), importlib.metadata (~55 ms), and numba (~0.3 s to
# import, ~0.6 s more at its first call: the balanced plan's and librosa's; the row pass
# is C, shared/memory/_row_pass.c).
LATE = ("numpy.ma", "pynvml", "num2words", "importlib.metadata", "numba")
# And in the stager: the index build's process pool.
STAGER_LATE = (*LATE, "multiprocessing", "concurrent.futures")


def test_a_start_imports_nothing_only_later_work_needs() -> None:
    for entry, late in (
        ("ringfeed.consumer.stager.stager", STAGER_LATE),
        ("ringfeed.producer.process.pool, ringfeed.producer.pipeline", LATE),
    ):
        code = (
            f"import sys, numpy as np, ringfeed.scripts.cli, {entry}\n"
            "from ringfeed.shared.corpus.speaking_rate import median\n"
            "median(np.arange(4.0))\n"
            f"sys.exit(str([m for m in {late!r} if m in sys.modules]))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert out.stderr.strip() == "[]", f"{entry}: {out.stderr}"


def test_tensorflow_in_a_ringfeed_process_leaves_out_what_it_only_probes_for() -> None:
    """import_tensorflow (the trainer's, the stager mels') imports TensorFlow without the
    JAX, matplotlib and scikit-learn it would otherwise import when installed; the
    process still imports each of them later, whole."""
    import importlib.util

    from ringfeed.consumer.devices import NOT_FOR_TENSORFLOW

    installed = [m for m in NOT_FOR_TENSORFLOW if importlib.util.find_spec(m) is not None]
    code = (
        "import sys\n"
        "from ringfeed.consumer.devices import import_tensorflow\n"
        "tf = import_tensorflow()\n"
        "assert int(tf.reduce_sum(tf.ones([3]))) == 3\n"
        f"loaded = [m for m in {NOT_FOR_TENSORFLOW!r} if m in sys.modules]\n"
        f"for m in {installed!r}:\n"
        "    assert __import__(m).__spec__ is not None, m\n"
        "print('loaded with tensorflow:', loaded)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loaded with tensorflow: []" in out.stdout, out.stdout
