"""Running another checkout's ringfeed beside this one (the benchmarks' --baseline).

Installed, ringfeed's folders live under the package ``ringfeed`` (pyproject maps
``ringfeed.shared`` to ``shared/`` and so on); the editable install maps them to
*this* checkout. A second checkout (``git worktree add /tmp/base main``) imports its
own code only where its ``ringfeed/`` holds links to its folders and its processes
start in it (``python -m`` imports from the working directory); without the links,
Python finds its ``ringfeed/__init__.py`` and then this checkout's subpackages, and
the comparison is of this code with itself. :func:`own_code` makes the links,
:func:`check_imports` refuses a run that would be mixed.
"""

from __future__ import annotations

from pathlib import Path

FOLDERS = ("shared", "producer", "consumer", "scripts")


def own_code(repo: Path) -> Path:
    """Link `repo`'s folders into its ringfeed/ (untracked, ignored by .git/info/exclude
    in this repository) so that code started there imports them; returns `repo`."""
    package = repo / "ringfeed"
    if package.is_dir():  # a checkout from before the package move imports top-level
        for name in FOLDERS:
            link = package / name
            if not link.exists() and (repo / name).is_dir():
                link.symlink_to(Path("..") / name)
    return repo


def check_imports(repo: Path) -> None:
    """Raise if this process imported ringfeed's runner from outside `repo`."""
    from ringfeed.scripts import runner

    where = Path(runner.__file__).resolve()
    if not where.is_relative_to(repo.resolve()):
        raise RuntimeError(f"{repo}'s run would import {where}: not its own code")
