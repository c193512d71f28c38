"""A producer that speaks another protocol version (a helper, not a test module).

    python tests/support/old_producer.py CONFIG ENDPOINT VERSION

runs one worker (producer/process/worker.py) whose shared.wire.protocol.VERSION is VERSION, as a
producer of an older or newer ringfeed would, and exits with its exit code.
"""

from __future__ import annotations

import sys

from ringfeed.producer.process.worker import run_worker
from ringfeed.shared.config import load_config
from ringfeed.shared.run.process import setup_logging
from ringfeed.shared.wire import protocol as p


def main(config: str, endpoint: str, version: str) -> int:
    setup_logging()
    p.VERSION = int(version)  # what encode writes and decode expects, in this process
    return run_worker(load_config(config), "old", endpoint)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
