"""What a run takes from its environment: the runtime directory, endpoints, hooks.

The only module that reads environment variables (STYLE 4); the schema itself
(shared/config/config.py) never does. Also what a process hands to a child it
starts (:func:`child_environment`), so the child imports the same ringfeed.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ringfeed.shared.config.loader import ConfigError

if TYPE_CHECKING:
    from ringfeed.shared.config.config import Config

# Environment variable naming a source hook, "module:callable" (see source_hook).
SOURCE_HOOK_ENV = "RINGFEED_SOURCE_HOOK"


@functools.cache
def shm_total_bytes() -> int:
    """The size of this host's /dev/shm (a container's is 64 MiB unless --shm-size says
    otherwise), or a large number where there is none to read: the rings' default budget
    (shared/config/config.py lookahead_batches)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 1 << 62
    return st.f_blocks * st.f_frsize


def launch_grace_s() -> float:
    """How long a launcher waits after SIGTERM before SIGKILL (RINGFEED_GRACE_S), seconds."""
    raw = os.environ.get("RINGFEED_GRACE_S", "8")
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"RINGFEED_GRACE_S: {raw!r} is not a number of seconds") from None


# Every name ringfeed makes in a shared place (/dev/shm, the runtime directory) starts
# with this: two users' runs never collide, and each sees only its own.
USER_PREFIX = f"ringfeed-{os.getuid()}-"


def runtime_dir() -> Path:
    """Where ipc sockets live: a directory of this user's only (mode 0700), so no other
    local user can connect to a run's control socket; short, as ipc endpoints are
    limited to ~107 bytes. RINGFEED_RUNTIME_DIR moves its parent (default /tmp)."""
    return Path(os.environ.get("RINGFEED_RUNTIME_DIR", "/tmp")) / USER_PREFIX.rstrip("-")


def ensure_runtime_dir() -> Path:
    """Create runtime_dir() with mode 0700, or check that the one there is ours and
    private; raises ConfigError saying what to do otherwise."""
    path = runtime_dir()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid():
        raise ConfigError(
            f"{path} is not a directory of this user's: remove it, or set "
            "RINGFEED_RUNTIME_DIR to a directory of your own"
        )
    if st.st_mode & 0o077:
        raise ConfigError(
            f"{path} is open to other users (mode {st.st_mode & 0o777:o}): run chmod 700 {path}"
        )
    return path


def user_cache_dir() -> Path:
    """This user's cache folder for ringfeed: $XDG_CACHE_HOME/ringfeed, else
    ~/.cache/ringfeed (the XDG base directory rule), else, with no home to find, beside
    the runtime directory. features.cache_dir's default lives in it."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, or relative: the spec says to ignore it
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:  # no HOME and no passwd entry
            return runtime_dir().parent / f"{USER_PREFIX}cache"
    return Path(base) / "ringfeed"


@dataclass(frozen=True)
class Endpoints:
    """ZeroMQ addresses of one run: control (ROUTER on ipc: local producers and the
    trainer), stats (PUB on ipc) and remote (ROUTER on tcp for other hosts, or "")."""

    control: str
    stats: str
    remote: str


def endpoints(cfg: Config, run_id: str) -> Endpoints:
    """Where the stager binds; producers and the trainer connect to the same strings."""
    t = cfg.transport
    base = runtime_dir() / f"{USER_PREFIX}{run_id}"
    remote = f"tcp://{t.host}:{t.port}" if t.kind == "tcp" else ""
    return Endpoints(f"ipc://{base}-control", f"ipc://{base}-stats", remote)


def run_dir(cfg: Config, run_id: str) -> Path:
    return Path(cfg.run_root) / run_id


def source_hook() -> str:
    """RINGFEED_SOURCE_HOOK: "module:callable", or "" (the default: no hook).

    For tests and benchmarks only: each producer wraps its source as
    callable(cfg, source) -> Source (producer/sources.py make_source), e.g. to
    inject faults (tests/support/fault_sources.py). Processes a launcher spawns inherit
    it; producers on Ray get it from source_hook_env."""
    return os.environ.get(SOURCE_HOOK_ENV, "")


def source_hook_env() -> dict[str, str]:
    """The source hook as environment variables, for a producer started where this
    process's environment does not reach (a Ray actor); {} when none is set."""
    hook = source_hook()
    return {SOURCE_HOOK_ENV: hook} if hook else {}


def tensorflow_log_level(has_gpu: bool = True) -> str:
    """TF_CPP_MIN_LOG_LEVEL for our TensorFlow processes, unless the user set it: 2
    (errors), or 3 on a host with no GPU, where TensorFlow's one error line is its CUDA
    probe failing ("failed call to cuInit"), which a CPU run expects."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2" if has_gpu else "3")


def cuda_visible_devices() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def xla_flags() -> str:
    """XLA_FLAGS as set for this process ("" when unset): JAX's XLA reads it once, when
    its backend starts (consumer/devices.py adds to it before the stager imports JAX)."""
    return os.environ.get("XLA_FLAGS", "")


# What the launcher tells a model process it starts (`ringfeed run CONFIG -- COMMAND`):
# the run's config file and run id, which the PyTorch and JAX loaders read when they are
# given none (consumer/client/loader_base.py).
CONFIG_ENV, RUN_ID_ENV = "RINGFEED_CONFIG", "RINGFEED_RUN_ID"


def model_process_run() -> tuple[str, str] | None:
    """(config file, run id) the launcher gave this model process, or None."""
    config, run_id = os.environ.get(CONFIG_ENV, ""), os.environ.get(RUN_ID_ENV, "")
    return (config, run_id) if config and run_id else None


def torch_worker() -> tuple[int, int] | None:
    """(RANK, WORLD_SIZE) as torchrun (and the launcher's `--worker K/N`) set them for a
    process of a torch.distributed job, or None; ConfigError when they are not numbers."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    if not (rank.isdigit() and world.isdigit() and int(rank) < int(world)):
        raise ConfigError(f"RANK={rank!r} WORLD_SIZE={world!r}: want 0 <= RANK < WORLD_SIZE")
    return int(rank), int(world)


def torchrun_job() -> str | None:
    """What the ranks of one torchrun job on this host share, for naming their runs: its
    rendezvous id (TORCHELASTIC_RUN_ID) where one was given, else the pid of the agent
    that started them all (their parent); None outside torchrun (no LOCAL_RANK)."""
    if os.environ.get("LOCAL_RANK") is None:
        return None
    job = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return job if job and job != "none" else str(os.getppid())


def code_root() -> Path:
    """The folder this process imported ringfeed from (a checkout, or site-packages)."""
    import ringfeed

    return Path(ringfeed.__file__).parent.parent


def child_environment() -> dict[str, str]:
    """This process's environment for a Python child it starts (`python -m ringfeed...`):
    PYTHONPATH starts with :func:`code_root`, so the child runs this process's ringfeed,
    not whichever one the interpreter would find first (another checkout's, installed)."""
    path = [str(code_root()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}
