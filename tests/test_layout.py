"""The tree says what the system is: folders are processes, no arrow from consumer to
producer, files and functions small enough to read, and the README's layout table true."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ringfeed.scripts.runner import REPO

# STYLE.md rule 3: past these, a file or function usually holds two concerns.
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 50
PACKAGES = ("shared", "producer", "consumer", "scripts", "tests", "benchmarks", "ringfeed")


def python_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def test_no_file_over_the_limit() -> None:
    long = []
    for path in python_files():
        n = len(path.read_text().splitlines())
        if n > MAX_FILE_LINES:
            long.append(f"{path.relative_to(REPO)}: {n} lines")
    listing = "\n".join(long)
    assert not long, f"files over {MAX_FILE_LINES} lines, split them by concern:\n{listing}"


def test_no_function_over_the_limit() -> None:
    long = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    listing = "\n".join(long)
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n{listing}"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_consumer_never_imports_producer_and_shared_imports_neither() -> None:
    arrows = []
    for pkg, forbidden in (("consumer", ("producer",)), ("shared", ("producer", "consumer"))):
        for path in (REPO / pkg).rglob("*.py"):
            for module in imported_modules(path):
                if module.removeprefix("ringfeed.").split(".")[0] in forbidden:
                    arrows.append(f"{path.relative_to(REPO)} imports {module}")
    assert arrows == []


def test_each_consumer_role_is_a_folder() -> None:
    roles = {p.name for p in (REPO / "consumer").iterdir() if p.is_dir() and p.name[0] != "_"}
    assert roles == {"stager", "trainer", "tools", "client"}
    loose = {p.name for p in (REPO / "consumer").glob("*.py")} - {"__init__.py"}
    assert loose == {"devices.py"}  # used by both TensorFlow processes, before TF loads


def test_readme_layout_table_matches_the_tree() -> None:
    """Every file the table names exists in its folder, and every module is named."""
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("## Layout") :]
    table = table[: table.index("\n## ", 4)]
    rows = re.findall(r"^\| `([\w/]+)/` \| (.+) \|$", table, re.M)
    assert rows, "no layout rows in README.md"
    for folder, text in rows:
        named = set(re.findall(r"`([\w.]+\.(?:py|sh))`", text))
        actual = {p.name for p in (REPO / folder).glob("*") if p.suffix in (".py", ".sh")}
        actual.discard("__init__.py")
        assert named == actual, f"README layout row {folder}/: named {named}, tree {actual}"


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in tests/conftest.py or in helper modules (runs.py, peers.py,
    ...): importing a test module runs its module code and ties its tests to others."""
    arrows = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [f"{node.module or ''}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                if any(part.startswith("test_") for part in name.split(".")):
                    arrows.append(f"{path.relative_to(REPO)}:{node.lineno} imports {name}")
    assert arrows == [], "move what they share into a helper module:\n" + "\n".join(arrows)
