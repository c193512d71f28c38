"""The docs site stays true (docs/development.md#this-site).

Every block marked RUNS runs as written, from a folder that holds what the repository
root holds for it (data/ and .venv/); every page and anchor cited anywhere (code, tests,
README, the pages) exists; every path the pages name is in the tree; the README stays
short; the site builds with --strict where mkdocs is installed (the dev extra).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from tests.support.paths import REPO

DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
RUNS = "<!-- runs as written: tests/docs/test_docs.py -->"
README_MAX_LINES = 200
# Where docs may be cited from: the code, its tests, benchmarks, configs and build files.
CITING = ("shared", "producer", "consumer", "scripts", "benchmarks", "tests", "configs", "ringfeed")
CITING_FILES = ("README.md", "pyproject.toml", "mkdocs.yml", ".ci/run")
# A page cited from the repository (docs/corpora.md#bring-your-own-data), or linked from a
# page to a page (corpora.md#...) or to its own section (#...).
CITED = re.compile(r"(?<![\w/.-])docs/([a-z0-9-]+\.md)(?:#([\w-]+))?")
LINKED = re.compile(r"\]\(([\w-]+\.md)?(?:#([\w-]+))?\)")
README_SECTION = re.compile(r"README[,:]? [\"']([^\"'\n]+)[\"']")
# A path into the tree as the pages and the README name it (outside code blocks).
TREE_PATH = re.compile(
    r"(?<![\w/.<-])((?:shared|producer|consumer|scripts|benchmarks|tests|configs|data|docs"
    r"|ringfeed|\.ci)/[\w./-]*[\w/])"
)


def prose(text: str) -> str:
    """The text without its fenced code blocks (a bash comment is no heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """The anchor mkdocs gives a heading (Python-Markdown's toc slugify)."""
    text = re.sub(r"[`*]", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings: {#explicit} ones, else the heading's slug."""
    headings = re.findall(r"^#{1,6} (.+?)(?: \{#([\w-]+)\})?$", prose(page.read_text()), re.M)
    found = [explicit or slug(text) for text, explicit in headings]
    assert len(found) == len(set(found)), f"{page.name}: two headings with one anchor"
    return set(found)


def citing_files() -> list[Path]:
    files = [REPO / name for name in CITING_FILES]
    for folder in CITING:
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".sh", ".yaml")]
    return [p for p in files if p.is_file()]  # rglob leaves ringfeed/'s links to folders alone


def test_every_cited_page_and_anchor_exists() -> None:
    known = {page.name: anchors(page) for page in PAGES}
    wrong = []
    for path in [*citing_files(), *PAGES]:
        for page, anchor in CITED.findall(path.read_text()):
            if page not in known or (anchor and anchor not in known[page]):
                wrong.append(f"{path.relative_to(REPO)}: docs/{page}#{anchor}")
    for path in PAGES:
        for page, anchor in LINKED.findall(prose(path.read_text())):
            target = page or path.name
            if target not in known or (anchor and anchor not in known[target]):
                wrong.append(f"docs/{path.name}: {page}#{anchor}")
    assert not wrong, "cited pages or anchors that do not exist:\n" + "\n".join(wrong)


def test_the_code_cites_no_readme_section_the_readme_lacks() -> None:
    """Sections moved to docs/: code cites their pages, never the README's old headings."""
    readme = set(re.findall(r"^#+ (.+)$", prose((REPO / "README.md").read_text()), re.M))
    wrong = [
        f"{path.relative_to(REPO)}: README {section!r}"
        for path in citing_files()
        for section in README_SECTION.findall(path.read_text())
        if section not in readme
    ]
    assert not wrong, "cite the docs page instead (docs/PAGE.md#anchor):\n" + "\n".join(wrong)


def test_every_path_the_docs_name_exists() -> None:
    missing = []
    for path in [REPO / "README.md", *PAGES]:
        for named in TREE_PATH.findall(prose(path.read_text())):
            if not (REPO / named).exists():
                missing.append(f"{path.relative_to(REPO)}: {named}")
    assert not missing, "paths that are not in the tree:\n" + "\n".join(missing)


def test_the_readme_is_short_and_keeps_the_quick_start() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, "move the detail to a docs page"
    assert "scripts/setup.sh && scripts/launch.sh " in readme
    assert "scripts/setup.sh && .venv/bin/python -m pytest " in readme
    assert "scripts/setup.sh && .venv/bin/python -m pytest" in (REPO / ".ci" / "run").read_text()


def test_every_page_is_in_the_navigation() -> None:
    nav = (REPO / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    assert sorted(re.findall(r": ([\w-]+\.md)$", nav, re.M)) == [p.name for p in PAGES]


# ------------------------------------------------------------------ runnable blocks


def runnable_blocks() -> list[tuple[str, str]]:
    """(page, block) of every bash block right after a RUNS line."""
    found = []
    for page in PAGES:
        pattern = re.escape(RUNS) + r"\n```bash\n(.*?)^```"
        found += [(page.name, b) for b in re.findall(pattern, page.read_text(), re.S | re.M)]
    return found


def block_id(block: str) -> str:
    named = re.search(r"format: (\w+)|cat > (\w+\.py)", block)
    return next(filter(None, named.groups())) if named else block.split("\n", 1)[0][:30]


def test_every_corpus_format_has_a_runnable_example() -> None:
    from ringfeed.shared.corpus.registry import FORMATS

    shown = {block_id(b) for page, b in runnable_blocks() if page == "corpora.md"}
    assert shown == set(FORMATS) - {"shards", "synthetic"}  # no files to paste: scale.md


@pytest.mark.parametrize(
    ("page", "block"), runnable_blocks(), ids=lambda v: v if v.endswith(".md") else block_id(v)
)
def test_a_marked_block_runs_as_written(tmp_path: Path, page: str, block: str) -> None:
    for framework in ("torch", "jax"):  # installed where reachable (scripts/setup.sh)
        if f"ringfeed.{framework}" in block:
            pytest.importorskip(framework)
    (tmp_path / "data").symlink_to(REPO / "data")
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    if page == "corpora.md":  # each format's example: validate finds both clips usable
        assert "usable        2 of 2 clips" in out.stdout, out.stdout
    if "my_fields.py" in block:
        check_user_fields(tmp_path, out.stdout)


def check_user_fields(folder: Path, validated: str) -> None:
    """The fields-of-your-own example (docs/sample-fields.md#fields-of-your-own): the
    function it wrote gives clips their fields through the producer's pipeline."""
    from ringfeed.producer.pipeline import SamplePipeline
    from ringfeed.shared.config import load_config, replace
    from ringfeed.shared.corpus.open import read_corpus
    from tests.support.broken_dataset import GOOD_SOURCES

    assert re.search(r"style +float32 +\[4, 16\] +own length", validated), validated
    sys.path.insert(0, str(folder))  # where a producer finds my_fields
    try:
        cfg = load_config(folder / "fields.yaml")
        pipe = SamplePipeline(replace(cfg, features={"cache_dir": str(folder / "cache")}))
        for entry in [e for e in read_corpus(cfg)[0] if e.item_id in GOOD_SOURCES]:
            s = pipe(entry)
            assert s.fields["loudness"].shape == (len(s.mel),)
            assert s.fields["emotion"].tolist() in ([0], [1])
            assert s.fields["style"].shape == (1 + len(entry.text) % 4, 16)
            assert np.isfinite(s.fields["style"]).all()
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("my_fields", None)


def test_the_benchmark_images_exist_and_the_charts_draw(tmp_path: Path) -> None:
    """The benchmarks page shows what their --plot drew (benchmarks/charts.py)."""
    from benchmarks.charts import draw_bars

    shown = re.findall(r"!\[[^\]]*\]\((img/[\w.-]+\.png)\)", (DOCS / "benchmarks.md").read_text())
    assert len(shown) >= 4 and all((DOCS / image).is_file() for image in shown), shown
    png = tmp_path / "bars.png"
    values = {"ringfeed": 8543.0, "pool": 1293.0}
    draw_bars(png, "title", [("samples/s", values), ("ms", values)], "a run", log_x=[True])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ the site


def test_the_site_builds_strictly_with_the_anchors_this_test_expects(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs comes with the dev extra (scripts/setup.sh)")
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # no banner about mkdocs 2
    )
    assert out.returncode == 0, out.stderr
    for page in PAGES:
        html = tmp_path / ("" if page.stem == "index" else page.stem) / "index.html"
        ids = set(re.findall(r'id="([^"]+)"', html.read_text()))
        assert anchors(page) <= ids, f"{page.name}: {sorted(anchors(page) - ids)}"
