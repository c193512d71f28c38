"""The data side a loader starts itself: the run's stager and local producers as child
processes of the training script, ended with its loop (docs/loaders.md#one-loop).

    side = DataSide(cfg, run_id, share)   # the corpus prepared here, then the children
    side.start()                          # `ringfeed stager` and `ringfeed producers`
    side.died()                           # the stager's log tail if it exited, else ""
    side.stop()                           # SIGTERM, SIGKILL after the grace; segments gone

A PyTorch or JAX user's loader given a config and no run does this
(consumer/client/loader_base.py), as DataLoader, grain and Mosaic's StreamingDataLoader
start their workers from the script. The loaders of ringfeed.torch and ringfeed.jax are
given this class (ringfeed/torch.py): the consumer package starts no process of ours
itself (tests/unit/test_layout.py). It is runner.py's Run (the one way to start a run's
processes from Python, which `ringfeed run` uses) with two differences:

- The children get a session of their own: a Ctrl-C in the terminal, or a SIGHUP
  when it closes, reaches the script alone, whose loader ends the loop at a batch
  boundary so that the loop's checkpoint code runs, then stops them here. Each child
  still gets SIGTERM when the script dies (PR_SET_PDEATHSIG: shared/run/process.py
  die_with_parent), SIGKILLed included, and the stager removes its segments on it.
- Their output goes to log files in the run directory, not into the script's (a
  notebook's cell) output: `<run-id>-stager-1.log`, `<run-id>-producers-2.log`.

One data side per training worker: under torchrun each rank's loader starts the stager
of its share (`--worker K/N`) and producers.workers producers, so a host of N ranks
runs N stagers and N x producers.workers producers (docs/loaders.md#several-gpus).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ringfeed.scripts.runner import Run
from ringfeed.shared.config import Config
from ringfeed.shared.config.environment import run_dir, torchrun_job
from ringfeed.shared.run.share import Share

log = logging.getLogger(__name__)

# The config the data side's processes read, written into the run directory.
CONFIG_FILE = "data-side.yaml"
# Lines of a dead stager's log quoted in the error.
LOG_TAIL_CHARS = 3000


class DataSide:
    """The stager and producer pool of one run (worker), children of this process."""

    def __init__(self, cfg: Config, run_id: str, share: Share) -> None:
        """run_id: this worker's (R-wK with several: share.run_id)."""
        self.directory = run_dir(cfg, run_id).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / CONFIG_FILE
        config.write_text(cfg.to_yaml())
        self.run = Run(config, run_id, log_dir=self.directory)
        self.run.own_session = True
        if share.count > 1:
            self.run.verb_args = {"stager": ["--worker", f"{share.index}/{share.count}"]}
        self.started_at: float | None = None

    @staticmethod
    def new_run_id() -> str:
        """The id of a run a loader starts: under torchrun the same on every rank of the
        job on this host (each rank's run is then R-wK), else new."""
        job = torchrun_job()
        if job is not None:
            return f"torchrun-{job}"
        from ringfeed.scripts.cli import new_run_id

        return new_run_id()

    def start(self) -> None:
        """Prepare the corpus here (what is current is skipped), then start the stager
        and the producers; raises as `ringfeed prepare` does (CorpusError, ConfigError)."""
        self.run.prepare()
        self.run.start("stager")
        self.run.start("producers")
        self.started_at = time.monotonic()
        log.info(
            "ringfeed: started run %s's stager (pid %d) and producers (pid %d); their logs "
            "are in %s",
            self.run.run_id,
            self.run.procs["stager"].pid,
            self.run.procs["producers"].pid,
            self.directory,
        )

    @property
    def running(self) -> bool:
        return self.started_at is not None

    def stager_log(self) -> Path:
        return self.directory / f"{self.run.run_id}-stager-1.log"

    def died(self) -> str:
        """'' while the stager runs; else what it exited with and its log's end."""
        proc = self.run.procs.get("stager")
        if proc is None or proc.poll() is None:
            return ""
        path = self.stager_log()
        tail = path.read_text()[-LOG_TAIL_CHARS:] if path.is_file() else ""
        return (
            f"the stager this loader started exited with code {proc.returncode}; its log "
            f"{path} ends:\n{tail}"
        )

    def stop(self, finished: bool = False) -> None:
        """End every child, bounded by the launch grace: after the loader's BYE
        (finished) the stager ends the run itself, else it gets SIGTERM now; then
        remove the run's segments and socket files. Idempotent."""
        if self.started_at is None:
            return
        self.started_at = None
        deadline = time.monotonic() + (self.run.grace_s if finished else 0.0)
        while time.monotonic() < deadline and any(
            p.poll() is None for p in self.run.procs.values()
        ):
            time.sleep(0.05)
        self.run.stop()
        self.run.cleanup()
