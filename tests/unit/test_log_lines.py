"""The processes' log lines: short module names on stderr, and the records themselves
untouched for every other handler (a user's logging set-up, pytest's caplog)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from ringfeed.shared.run.process import setup_logging


def test_a_process_logs_its_modules_without_the_package() -> None:
    code = (
        "import logging; from ringfeed.shared.run.process import setup_logging;"
        "setup_logging(); logging.getLogger('ringfeed.consumer.stager.stager').info('hello')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert " consumer.stager.stager: hello" in proc.stderr
    assert "ringfeed.consumer" not in proc.stderr


def test_another_handler_sees_the_loggers_real_name(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.name)

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [Keep()])
    monkeypatch.setattr(root, "level", logging.INFO)
    setup_logging()  # a set-up exists: left as it is
    logging.getLogger("ringfeed.progress").info("step 1")
    assert seen == ["ringfeed.progress"]
    assert [type(h) for h in root.handlers] == [Keep]
