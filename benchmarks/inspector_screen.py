"""The inspector's screen of a real run, for docs/inspector.md: a text capture and a PNG.

    python benchmarks/inspector_screen.py [CONFIG] [--after-steps N]
        [--text docs/img/inspector.txt] [--png docs/img/inspector.png]

Starts the whole run of CONFIG (default configs/demo.yaml: the shipped LJSpeech
clips, the project's model) as `scripts/launch.sh run` would, waits until the
trainer has reported N steps (default 20), takes one inspector snapshot (with two
stats messages behind it, so producer rates are known) and writes the screen as
`ringfeed inspect` shows it, less its ANSI bold, then stops the run.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
import uuid
from pathlib import Path

from charts import draw_screen, run_label

from ringfeed.consumer.tools.inspector import Inspector
from ringfeed.consumer.tools.screen import render
from ringfeed.scripts.runner import Run
from ringfeed.shared.memory.ring import RingError

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 600.0  # a first start measures lengths and warms the feature cache


def attach(run_id: str, config: Path, deadline: float) -> Inspector:
    """The inspector once the stager has created its rings."""
    while True:
        try:
            return Inspector(run_id, str(config))
        except RingError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def capture(config: Path, after_steps: int) -> str:
    run_id = f"screen-{uuid.uuid4().hex[:6]}"
    deadline = time.monotonic() + WAIT_S
    with tempfile.TemporaryDirectory() as tmp, Run(config, run_id, Path(tmp)) as run:
        run.start_all("trainer")
        insp = attach(run_id, config, deadline)
        try:
            while time.monotonic() < deadline:
                insp.poll_stats(1.0)
                trainer = insp.stats.trainer if insp.stats is not None else None
                if trainer is not None and trainer.step >= after_steps:
                    insp.poll_stats(1.0)  # one more message: rates over a second
                    return re.sub(r"\x1b\[[0-9;]*m", "", render(insp.snapshot()))
                if any(p.poll() not in (None, 0) for p in run.procs.values()):
                    raise SystemExit(f"the run failed:\n{run.logs()}")
            raise SystemExit(f"no {after_steps} steps in {WAIT_S:.0f} s:\n{run.logs()}")
        finally:
            insp.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(REPO / "configs" / "demo.yaml"))
    parser.add_argument("--after-steps", type=int, default=20)
    parser.add_argument("--text", default=str(REPO / "docs" / "img" / "inspector.txt"))
    parser.add_argument("--png", default=str(REPO / "docs" / "img" / "inspector.png"))
    args = parser.parse_args()
    screen = capture(Path(args.config).absolute(), args.after_steps)
    print(screen)
    Path(args.text).write_text(screen + "\n")
    draw_screen(args.png, screen, run_label("inspector_screen.py"))
    print(f"wrote {args.text} and {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
