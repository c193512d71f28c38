"""Faults injected into producers, for tests and benchmarks (a helper, not a test module).

The config has no fault keys: faults come in through the producer's source hook
(RINGFEED_SOURCE_HOOK, shared/config/config.py source_hook). After

    cfg_path = write_config(tmp_path, raw)
    inject_faults(cfg_path, raise_items=[17], delay_s=0.002)

every producer of a run of that config wraps its source in :class:`FaultySource`:

- every sample takes ``delay_s`` longer (slow producers; pacing for tests that
  act in the middle of a run);
- an item in ``raise_items`` raises ZeroDivisionError, an exception no code
  expects (it must cost that item only, quarantined once with its stage);
- an item in ``exit_items`` ends its process with exit code 3, the code a
  worker's session ends with when the run is finished (a library that calls
  exit with any code: the pool restarts the worker, the stager charges the item);
- an item in ``loop_items`` never finishes, in Python (an endless loop in a
  library: the worker's alarm must end it); one in ``stuck_items`` never
  finishes where no alarm reaches (SIGALRM blocked, as in a hung C call: the
  pool must kill the worker).

How the faults reach the producers: inject_faults sets RINGFEED_SOURCE_HOOK in
this process's environment, which every process it starts inherits (Ray actors
get it from producer/process/ray_pool.py), and writes the faults to FAULTS_FILE in the
config's run_root, where the hook reads them. So faults belong to the runs of
one config: a later test's runs (another run_root) see none, although the hook
stays set, and two configs of one test may have different faults.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ringfeed.producer.sample import Sample
from ringfeed.producer.sources import Source
from ringfeed.shared.config import Config, load_config
from ringfeed.shared.config.environment import SOURCE_HOOK_ENV

# By file, not module name: producers that a launcher starts in another working
# directory (scripts/slurm.sh, Ray actors) cannot import the tests package.
HOOK = f"{Path(__file__).resolve()}:with_faults"
# Beside the run directories under run_root: one fault plan per config.
FAULTS_FILE = "faults.json"


@dataclass(frozen=True)
class Faults:
    raise_items: tuple[int, ...] = ()
    exit_items: tuple[int, ...] = ()
    delay_s: float = 0.0
    loop_items: tuple[int, ...] = ()
    stuck_items: tuple[int, ...] = ()


def inject_faults(
    cfg_path: Path,
    *,
    raise_items: tuple[int, ...] | list[int] = (),
    exit_items: tuple[int, ...] | list[int] = (),
    delay_s: float = 0.0,
    loop_items: tuple[int, ...] | list[int] = (),
    stuck_items: tuple[int, ...] | list[int] = (),
) -> None:
    """Make every producer of runs of this config inject these faults (replacing any
    set before for it); no faults given: none."""
    faults = Faults(
        tuple(raise_items), tuple(exit_items), delay_s, tuple(loop_items), tuple(stuck_items)
    )
    root = Path(load_config(cfg_path).run_root)
    root.mkdir(parents=True, exist_ok=True)
    (root / FAULTS_FILE).write_text(json.dumps(asdict(faults)))
    os.environ[SOURCE_HOOK_ENV] = HOOK


def with_faults(cfg: Config, source: Source) -> Source:
    """The source hook: the source wrapped with its config's faults, or as it is."""
    path = Path(cfg.run_root) / FAULTS_FILE
    if not path.exists():
        return source
    raw = json.loads(path.read_text())
    faults = Faults(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
    return FaultySource(source, faults) if faults != Faults() else source


class FaultySource:
    """A source that misbehaves as its Faults say, and otherwise is the one it wraps."""

    def __init__(self, source: Source, faults: Faults) -> None:
        self.source, self.faults = source, faults
        self.n_items = source.n_items

    def item_id(self, item: int) -> str:
        return self.source.item_id(item)

    def path(self, item: int) -> str:
        return self.source.path(item)

    def warm_up(self) -> None:
        self.source.warm_up()

    def work(self) -> dict[str, int]:
        return self.source.work()

    def prepare(self, item: int, epoch: int = 0) -> Sample:
        if self.faults.delay_s > 0:
            time.sleep(self.faults.delay_s)
        if item in self.faults.raise_items:
            raise ZeroDivisionError(f"injected fault: item {item} is in raise_items")
        if item in self.faults.exit_items:
            os._exit(3)  # a library's exit, with the code of a worker whose run is over
        while item in self.faults.loop_items:
            pass  # a library's endless loop, in Python
        if item in self.faults.stuck_items:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            while True:
                time.sleep(1)  # a hung C call: no alarm gets through
        return self.source.prepare(item, epoch)
