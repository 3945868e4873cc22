"""What every command group of the CLI shares: the consoles, the `--json` option and the
SDK client of a command (from the root's `--url` / `--api-key`, then the environment and the
saved login: `torchyard.client.Client`)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console

from torchyard.client import Client

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def command_client(ctx: typer.Context) -> Client:
    """The command's client, closed when the command ends."""
    root = ctx.find_root().obj or {}
    return ctx.with_resource(Client(root.get("url"), root.get("api_key")))


def print_json(data: Any) -> None:
    """`data` (pydantic models, lists of them, or plain JSON values) as indented JSON."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    elif isinstance(data, list):
        data = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    typer.echo(json.dumps(data, indent=2, default=str))
