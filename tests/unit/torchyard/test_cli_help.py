"""Every CLI command's help names values by what they are and shows an example that parses
(issue 15: no `<bool>`-style placeholders; an example in every command's help)."""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from torchyard.cli import app

ROOT = typer.main.get_command(app)
PLACEHOLDER = re.compile(r"<(bool|str|int|float|list|path|dict|tuple|datetime)[^>]*>")
EXAMPLE = re.compile(r"Examples?: `?(torchyard [^`\n]+)")


def _leaves(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    subs = getattr(command, "commands", None)
    if subs:
        for name, sub in subs.items():
            yield from _leaves(sub, (*path, name))
    else:
        yield path, command


LEAVES = list(_leaves(ROOT))


def _leaves_and_groups(
    command: Any, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _leaves_and_groups(sub, (*path, name))


def test_every_command_is_found() -> None:
    names = {" ".join(path) for path, _ in LEAVES}
    assert {"submit", "logs", "datasets upload", "keys create", "export"} <= names


@pytest.mark.parametrize(
    ("path", "command"), LEAVES, ids=lambda v: " ".join(v) if isinstance(v, tuple) else ""
)
def test_help_has_no_type_placeholders_and_an_example_that_parses(
    path: tuple[str, ...], command: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert not PLACEHOLDER.search(shown.output), shown.output
    found = EXAMPLE.search(command.help or "")
    assert found, f"`torchyard {' '.join(path)} --help` has no `Example: ...`"
    words = [w for w in shlex.split(found[1]) if not re.match(r"^[A-Z_]+=", w)]
    assert words[: 1 + len(path)] == ["torchyard", *path], found[1]
    # Parsing the example's arguments checks every option and argument it uses exists (the
    # local files it names are made, empty, in a scratch directory).
    monkeypatch.chdir(tmp_path)
    for word in words:
        if word.startswith("./"):
            Path(word).touch()
    command.make_context(path[-1], words[1 + len(path) :])


GROUPS = [path for path, command in _leaves_and_groups(ROOT) if getattr(command, "commands", None)]


@pytest.mark.parametrize("path", GROUPS, ids=lambda p: " ".join(p) or "torchyard")
def test_command_lists_at_80_columns_wrap_only_at_the_edge_in_at_most_two_lines(
    path: tuple[str, ...],
) -> None:
    """Issue 45, item 9: `torchyard --help` broke its command list mid-phrase (a docstring's
    line breaks kept: "cost per UTC" / "day, pool or job") and ran to eight lines a command."""
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    panel = shown.output.split("─ Commands ")[1].splitlines()[1:]
    rows = [line[2:-1].rstrip() for line in panel if line.startswith("│")]
    start = len(rows[0]) - len(rows[0].split("  ")[-1].lstrip())
    width = len(panel[0]) - 3 - start
    entries: list[list[str]] = []
    for row in rows:
        if row[:start].strip():
            entries.append([])
        entries[-1].append(row[start:].strip())
    for lines in entries:
        assert len(lines) <= 2, lines
        for line, after in itertools.pairwise(lines):
            assert len(line) + 1 + len(after.split()[0]) > width, f"broken early: {lines}"
