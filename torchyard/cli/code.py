"""The `torchyard` commands of `torchyard.code` (typer, rich): the SDK part stays there,
importing neither."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from torchyard.cli.common import JsonOpt, command_client, out
from torchyard.code import (
    Code,
)
from torchyard.tables import Column, ListTable
from torchyard.types import CodeArchive
from torchyard.units import format_age, format_bytes

# The `torchyard code` commands; `torchyard submit --code DIR` is in torchyard.cli.
code_app = typer.Typer(no_args_is_help=True, help="Training code for entrypoint jobs.")


def _code(ctx: typer.Context) -> Code:
    return command_client(ctx).code


def _table(archives: builtins.list[CodeArchive]) -> ListTable:
    """One row per archive: id (whole: `entrypoint.code` takes it), name, format, files, size,
    sha256 (start), age; the sha256 and format go first on a narrow terminal."""
    table = ListTable(
        Column("ID", "id"),
        Column("NAME", "name"),
        Column("FORMAT", "id", drop=2),
        Column("FILES", "num", drop=3),
        Column("SIZE", "num", drop=4),
        Column("SHA256", "id", drop=1),
        Column("CREATED", "id", drop=5),
    )
    for a in archives:
        table.add_row(
            Text(a.id),
            Text(a.name),
            a.format,
            str(a.num_files),
            format_bytes(a.size_bytes),
            a.sha256[:12],
            format_age(a.created_at),
        )
    return table


def _show(archive: CodeArchive, json_out: bool) -> None:
    if json_out:
        typer.echo(archive.model_dump_json(indent=2))
        return
    out.print(_table([archive]))
    for name in archive.files or []:
        out.print(Text(f"  {name}"))


@code_app.command("upload")
def code_upload(
    ctx: typer.Context,
    path: Annotated[
        Path,
        typer.Argument(exists=True, help="A directory, or a .tar.gz/.zip.", metavar="DIR|FILE"),
    ],
    name: Annotated[str | None, typer.Option("--name", help="Default: its name.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Upload training code (a directory is archived, minus what .gitignore ignores).

    Example: `torchyard code upload ./my_trainer --name trainer-v2`
    """
    _show(_code(ctx).upload(path, name=name), json_out)


@code_app.command("list")
def code_list(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """List the project's code archives, newest first.

    Example: `torchyard code list`
    """
    items = _code(ctx).list()
    if json_out:
        typer.echo("[" + ",".join(a.model_dump_json() for a in items) + "]")
    else:
        out.print(_table(items) if items else "no code archives")


@code_app.command("show")
def code_show(
    ctx: typer.Context,
    code_id: Annotated[str, typer.Argument(help="Archive id (code_...).", metavar="ID")],
    json_out: JsonOpt = False,
) -> None:
    """Show one code archive and its files.

    Example: `torchyard code show code_0123abcd`
    """
    _show(_code(ctx).get(code_id), json_out)
