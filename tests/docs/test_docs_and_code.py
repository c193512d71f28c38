"""The pages agree with the code they describe: the config reference is generated from the
schema, the layout table names the tree, every `ringfeed VERB --option` quoted parses."""

from __future__ import annotations

import re

from tests.support.paths import REPO


def test_every_command_a_message_suggests_exists() -> None:
    """An error once suggested `ringfeed inspect --list`, which never existed. Every
    `ringfeed VERB --option` quoted in the code, the README and the docs must parse."""
    import re

    from ringfeed.scripts.cli import build_parser

    verbs = build_parser()._subparsers._group_actions[0].choices
    folders = ("shared", "producer", "consumer", "scripts")
    code = [f for d in folders for f in (REPO / d).rglob("*.py")]
    files = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *code]
    quoted = set()
    for path in files:
        for command in re.findall(r"`(?:\.venv/bin/)?ringfeed ([^`]*)`", path.read_text()):
            quoted.add((path.name, command))
    assert len(quoted) > 20
    for where, command in sorted(quoted):
        verb, *rest = command.split()
        if verb in ("VERB", "..."):
            continue
        assert verb in verbs, f"{where}: `ringfeed {command}`: no verb {verb!r}"
        known = {o for a in verbs[verb]._actions for o in a.option_strings}
        rest = rest[: rest.index("--")] if "--" in rest else rest  # then the user's command
        for option in (w.split("=")[0] for w in rest if w.startswith("--")):
            assert option in known, f"{where}: `ringfeed {command}`: {verb} has no {option}"


def test_the_config_reference_in_the_repository_is_current_and_explains_every_key() -> None:
    from ringfeed.shared.config.reference import REFERENCE, reference_markdown, reference_rows

    rows = reference_rows()
    assert len(rows) > 60 and all(meaning for *_, meaning in rows), [
        key for key, *_, meaning in rows if not meaning
    ]
    assert REFERENCE.read_text() == reference_markdown(), (
        "docs/config-reference.md is stale: run `ringfeed config --write`"
    )


def test_the_docs_layout_table_matches_the_tree() -> None:
    """Every file the table names exists in its folder, and every module is named."""
    page = (REPO / "docs" / "design.md").read_text()
    table = page[page.index("## Layout") :]
    table = table[: table.index("\n## ", 4)]
    rows = re.findall(r"^\| `([\w/]+)/` \| (.+) \|$", table, re.M)
    assert rows, "no layout rows in docs/design.md"
    for folder, text in rows:
        named = set(re.findall(r"`([\w.]+\.(?:py|sh))`", text))
        actual = {p.name for p in (REPO / folder).glob("*") if p.suffix in (".py", ".sh")}
        actual.discard("__init__.py")
        assert named == actual, f"docs/design.md layout row {folder}/: named {named}, tree {actual}"
