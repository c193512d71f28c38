"""The project's Python files, and how long its files and functions are: a report printed at
the end of every test run (tests/conftest.py), not a gate. A file holds one concern at
whatever length that takes; a long one is a hint to look for a second concern
(docs/development.md#layout, ../shared/STYLE.md rule 3)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

PACKAGES = ("shared", "producer", "consumer", "scripts", "tests", "benchmarks", "ringfeed")
# Entries each list of the report shows.
SHOWN = 5


def python_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def lengths() -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(lines, file) of every file and (lines, file:line name) of every function, longest
    first."""
    files, functions = [], []
    for path in python_files():
        text, name = path.read_text(), str(path.relative_to(REPO))
        files.append((len(text.splitlines()), name))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                functions.append((n, f"{name}:{node.lineno} {node.name}"))
    return sorted(files, reverse=True), sorted(functions, reverse=True)


def report() -> list[str]:
    """The longest files and functions, one line each."""
    files, functions = lengths()
    lines = [f"longest files of {len(files)}:"]
    lines += [f"  {n:5d}  {name}" for n, name in files[:SHOWN]]
    lines.append(f"longest functions of {len(functions)}:")
    lines += [f"  {n:5d}  {name}" for n, name in functions[:SHOWN]]
    return lines
