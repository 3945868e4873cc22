"""Render the `torchyard` command reference (Markdown) from the typer app itself.

`python scripts/cli_reference.py` prints it; `--write` writes docs/reference/cli.md.
tests/unit/project/test_reference_docs.py keeps the committed page equal to this output, so a
new command, option or help text shows up in the docs with the change that made it.

The walk goes through the click command tree typer builds (`typer.main.get_command`): each
group's commands in name order, each command's help (its docstring), its usage line and one
row per argument and option with the help record click prints for `--help`.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import typer.main

from torchyard.cli import app

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"
HEADER = """# CLI reference

Generated from the `torchyard` command itself (`python scripts/cli_reference.py --write`;
`torchyard COMMAND --help` prints the same). Every command talks to the API named by `--url` /
`TORCHYARD_URL` with the key of `--api-key` / `TORCHYARD_API_KEY` (or what `torchyard login`
saved), except the server commands (`api`, `worker`, `exporter`, `controller`, `beat`,
`slurm-submitter`, `admin`), which read the server's settings from the environment.
"""


def _escape(text: str) -> str:
    """`<` outside code spans as `&lt;`, so Markdown does not read `<api key>` as an HTML tag;
    inside backticks it is shown as written."""
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def _cell(text: str) -> str:
    """`text` on one line, safe inside a Markdown table cell."""
    return _escape(" ".join(text.split()).replace("|", "\\|").replace("*", "\\*"))


def _usage(command: Any, ctx: Any, path: list[str]) -> str:
    pieces = [piece.strip("{}") for piece in command.collect_usage_pieces(ctx)]
    return " ".join([*path, *pieces])


def _command(command: Any, path: list[str], parent: Any, lines: list[str]) -> None:
    ctx = command.make_context(path[-1], [], resilient_parsing=True, parent=parent)
    subcommands = getattr(command, "commands", {})
    if len(path) > 1:
        lines += ["", f"{'#' * min(len(path), 4)} `{' '.join(path)}`", ""]
        help_text = inspect.cleandoc(command.help or "")
        if help_text:
            lines += [_escape(help_text), ""]
    lines += ["```text", _usage(command, ctx, path), "```"]
    rows = [
        record
        for param in command.get_params(ctx)
        if (record := param.get_help_record(ctx)) is not None and record[0] != "--help"
    ]
    if rows:
        lines += ["", "| argument or option | meaning |", "|---|---|"]
        lines += [f"| `{_cell(name)}` | {_cell(meaning)} |" for name, meaning in rows]
    for name in sorted(subcommands):
        if not subcommands[name].hidden:
            _command(subcommands[name], [*path, name], ctx, lines)


def render() -> str:
    """The whole page: the header, the root's options, then every command depth first."""
    root = typer.main.get_command(app)
    lines = HEADER.splitlines()
    lines += ["", "## Global options", ""]
    _command(root, ["torchyard"], None, lines)
    return "\n".join(line.rstrip() for line in lines) + "\n"


def main() -> int:
    text = render()
    if "--write" in sys.argv:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
