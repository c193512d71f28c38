"""The tree says what the system is: folders are processes, shared/ in layers, no arrow from
consumer to producer, no import circle (the layout table of docs/design.md#layout:
tests/docs/test_docs_and_code.py). How long files and functions are is a report, printed at
the end of every test run (tests/conftest.py), never a gate: a file holds one concern at
whatever length that takes (docs/development.md#layout)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.layout import PACKAGES, python_files
from tests.support.paths import REPO


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def module_name(path: Path) -> str:
    """ringfeed's dotted name of a file under one of the folders (shared/ring.py ->
    shared.ring), the package itself for an __init__.py."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path) -> set[str]:
    """The ringfeed modules a file imports when it runs: at the top and inside functions,
    not under `if TYPE_CHECKING:` (annotations only); names relative to ringfeed.
    `from pkg import name` counts as pkg.name when that is a module."""
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for n in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found.update(n.removeprefix("ringfeed.") for n in names if n.startswith("ringfeed."))
    return found


def module_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports at run time (shared, producer, consumer,
    scripts, ringfeed)."""
    files = {module_name(p): p for pkg in PACKAGES[:4] for p in (REPO / pkg).rglob("*.py")}
    return {m: {n for n in runtime_imports(p) if n in files and n != m} for m, p in files.items()}


# shared/'s layers, bottom first: a module imports from its own sub-package or from a
# lower layer, never from its own layer's other sub-packages or from above (STYLE 4).
SHARED_LAYERS = ({"sample", "language"}, {"config"}, {"wire", "memory"}, {"corpus"}, {"run"})


def test_shared_sub_packages_import_only_downwards() -> None:
    rank = {sub: k for k, layer in enumerate(SHARED_LAYERS) for sub in layer}
    folders = {p.name for p in (REPO / "shared").iterdir() if p.is_dir() and p.name[0] != "_"}
    assert folders == set(rank), f"a sub-package of shared/ without a layer: {folders ^ set(rank)}"
    loose = {p.name for p in (REPO / "shared").glob("*.py")} - {"__init__.py"}
    assert loose == set(), f"modules of shared/ belong in a sub-package: {loose}"
    graph, arrows = module_graph(), []
    for module, imports in sorted(graph.items()):
        if not module.startswith("shared."):
            continue
        sub = module.split(".")[1]
        for other in sorted(imports):
            there = other.split(".")[1] if other.startswith("shared.") else None
            if there is not None and there != sub and rank[there] >= rank[sub]:
                arrows.append(
                    f"{module} ({sub}, layer {rank[sub]}) imports {other} "
                    f"({there}, layer {rank[there]})"
                )
    layers = " < ".join("/".join(sorted(layer)) for layer in SHARED_LAYERS)
    assert arrows == [], f"layers: {layers}\n" + "\n".join(arrows)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_runtime_import_circle() -> None:
    """Not even through an import inside a function: a circle ties its modules into one
    that must be read (and changed) together."""
    graph = module_graph()
    text = [
        " -> ".join(c)
        + "\n    "
        + "\n    ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c)
        for c in cycles(graph)
    ]
    assert text == [], "import circles:\n" + "\n".join(text)


# What a reader of the stager's output imports from consumer/stager/: its plan only (what
# it shares with the other processes lives in shared/: the batch ring's layout, the run
# secret, the stats record, the plan share).
STAGER_CONTRACTS = {"plan"}


def test_the_client_trainer_and_tools_import_only_the_stagers_contracts() -> None:
    arrows = []
    for module, imports in sorted(module_graph().items()):
        if module.startswith(("consumer.client", "consumer.trainer", "consumer.tools")):
            arrows += [
                f"{module} imports {other}"
                for other in sorted(imports)
                if other.startswith("consumer.stager.")
                and other.split(".")[2] not in STAGER_CONTRACTS
            ]
    assert arrows == [], "\n".join(arrows)


def test_only_the_stagers_builder_knows_the_ledgers_table() -> None:
    """Every other part of the stager holds the slot ledger as its face (ledger/face.py
    SlotLedger; mypy in .ci/run holds what they call on it): none imports the table."""
    arrows = [
        f"{module} imports consumer.stager.ledger.table"
        for module, imports in sorted(module_graph().items())
        if "consumer.stager.ledger.table" in imports
        and module not in ("consumer.stager.stager", "consumer.stager.ledger.table")
    ]
    assert arrows == [], "\n".join(arrows)


def test_consumer_never_imports_producer_and_shared_imports_neither() -> None:
    arrows = []
    for pkg, forbidden in (("consumer", ("producer",)), ("shared", ("producer", "consumer"))):
        for path in (REPO / pkg).rglob("*.py"):
            for module in imported_modules(path):
                if module.removeprefix("ringfeed.").split(".")[0] in forbidden:
                    arrows.append(f"{path.relative_to(REPO)} imports {module}")
    assert arrows == []


def test_the_consumer_never_starts_a_process_of_ours() -> None:
    """The stager once ran `python -m ringfeed.scripts.cli lengths` in a subprocess,
    round the rule above: producer code ran for it. Preparation is `ringfeed prepare`'s
    (producer/prepare/), before the run; the consumer reads what it wrote."""
    found = []
    for path in sorted((REPO / "consumer").rglob("*.py")):
        text = path.read_text()
        if "subprocess" in imported_modules(path) or "ringfeed.scripts" in text:
            found.append(str(path.relative_to(REPO)))
    assert found == [], found


def test_each_consumer_role_is_a_folder() -> None:
    roles = {p.name for p in (REPO / "consumer").iterdir() if p.is_dir() and p.name[0] != "_"}
    assert roles == {"stager", "trainer", "tools", "client"}
    loose = {p.name for p in (REPO / "consumer").glob("*.py")} - {"__init__.py"}
    assert loose == {"devices.py"}  # used by both TensorFlow processes, before TF loads


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in tests/conftest.py or in tests/support/ (runs.py, peers.py,
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


def test_nothing_imports_the_folders_by_their_top_level_names() -> None:
    """Installed, the folders are ringfeed.shared, ringfeed.producer, ...: an import of
    a top-level `shared` (in code, a `python -c` string or a shell script) works only
    from the repository's root, where tests run, and breaks for every user."""
    pkgs = "(?:shared|producer|consumer|scripts)"
    top_level = re.compile(
        rf"(?<![\w.])from {pkgs}(?:\.\w+)* import |(?:^|[;\"'(\s])import {pkgs}(?:\.\w+)*"
        rf"(?:\s*$| as |[,;\"'\\])|-m {pkgs}\.|[\"']-m[\"'],\s*[\"']{pkgs}\."
    )
    files = [*python_files(), *REPO.glob("scripts/*.sh")]
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if top_level.search(line) and p.name != "test_package.py"
    ]
    assert found == [], "\n".join(found)
