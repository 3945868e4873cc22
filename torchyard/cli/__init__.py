"""The ``torchyard`` command line: submit and watch jobs, manage datasets, run the servers.

Tables for people by default, ``--json`` for scripts. Any API error is printed in red (a 422
with one ``path: message`` line per bad field) and exits with status 1; following a job exits
with 1 unless it succeeded.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text
from typer.core import TyperArgument, TyperGroup, TyperOption

from torchyard.cli.access import keys_app, members_app
from torchyard.cli.code import code_app
from torchyard.cli.common import JsonOpt, command_client, err, out, print_json
from torchyard.cli.datasets import datasets_app
from torchyard.cli.exports import export_command, export_lora_command
from torchyard.cli.jobs import jobs_cli
from torchyard.cli.servers import admin_app, servers_cli
from torchyard.cli.sessions import sessions_app
from torchyard.cli.sweeps import sweep_app
from torchyard.cli.usage import usage_command
from torchyard.cli.workers import workers_command
from torchyard.client import Client
from torchyard.config import save_config
from torchyard.errors import TorchyardError
from torchyard.quickstart import quickstart_command
from torchyard.render import (
    error_lines,
)
from torchyard.specs import SpecFileError

if TYPE_CHECKING:
    # typer >= 0.2x vendors click; its groups get this Context, not `click.Context` (click is
    # no longer a dependency of typer).
    from typer._click.core import Context as ClickContext


class _Group(TyperGroup):
    """Turns SDK errors into a red message and exit status 1 for every command, and names each
    value in help by what it is (`KEY`, `SPEC`), not by Python type placeholders (`<str>`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _tidy_help(self)

    def invoke(self, ctx: ClickContext) -> Any:
        try:
            return super().invoke(ctx)
        except (TorchyardError, SpecFileError) as exc:
            lines = error_lines(exc) if isinstance(exc, TorchyardError) else [str(exc)]
            err.print(Text(f"error: {lines[0]}", style="red"))
            for line in lines[1:]:
                err.print(Text(line, style="red"))
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print(Text("interrupted", style="yellow"))
            raise typer.Exit(130) from None


def _tidy_help(command: Any) -> None:
    """Help without type placeholders: a flag shows no value, an option its name in capitals
    (or the metavar it was given), an argument its metavar alone. Walks sub-commands."""
    for param in command.params:
        if isinstance(param, TyperOption):
            if param.is_flag:
                param.metavar = ""
            elif param.metavar is None:
                desc = param.type_descriptor
                choices = desc.choices if desc.is_choice else None
                # A choice shows its values (`gpt|chat-sft|dpo`), any other value its name.
                param.metavar = (
                    "|".join(map(str, choices)) if choices else (param.name or "value").upper()
                )
        elif isinstance(param, TyperArgument):
            param.metavar = param.metavar or (param.name or "value").upper()
            param.display_type_rich = lambda ctx: None  # type: ignore[method-assign] # the metavar says it
    plain_help = command.get_help_option

    def get_help_option(ctx: ClickContext) -> Any:
        option = plain_help(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        sub.short_help = sub.short_help or command_summary(sub.help)
        _tidy_help(sub)


SUMMARY_WIDTH = 58  # the help column of a command list on an 80-column terminal


def command_summary(help_text: str | None) -> str:
    """A command's line in its group's command list: the first paragraph of its help on one
    line (that list keeps a docstring's line breaks), cut to its first clause (up to a `:` or
    `;` outside brackets and backticks) when it would not fit on 80 columns, and before its
    first bracket when that clause would still take more than two lines."""
    first = " ".join(inspect.cleandoc(help_text or "").split("\n\n")[0].split())
    if len(first) <= SUMMARY_WIDTH:
        return first
    clause = _cut_at(first, ":;")
    return clause if len(clause) <= 2 * SUMMARY_WIDTH else _cut_at(clause, "(")


def _cut_at(text: str, marks: str) -> str:
    """`text` up to the first of `marks` outside brackets and backticks that a space follows
    (`(`: that a space precedes), trailing space dropped; all of it when there is none."""
    depth, quoted = 0, False
    for i, char in enumerate(text):
        spaced = text[i - 1 : i] == " " if char == "(" else text[i + 1 : i + 2] == " "
        if not quoted and depth == 0 and char in marks and spaced and i > 0:
            return text[:i].rstrip()
        if char == "`":
            quoted = not quoted
        elif not quoted and char in "([{":
            depth += 1
        elif not quoted and char in ")]}":
            depth -= 1
    return text


app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    help="Torchyard: submit PyTorch training jobs and follow them.",
)
app.add_typer(datasets_app, name="datasets")
app.add_typer(admin_app, name="admin")
app.add_typer(code_app, name="code")
app.add_typer(keys_app, name="keys")
app.add_typer(members_app, name="members")
app.add_typer(sweep_app, name="sweep")
app.add_typer(sessions_app, name="sessions")
app.command("quickstart")(quickstart_command)
app.command("export")(export_command)
app.command("export-lora")(export_lora_command)
app.command("usage")(usage_command)
app.command("workers")(workers_command)
app.registered_commands += jobs_cli.registered_commands  # submit, jobs, show, ... metrics


@app.callback()
def _root(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option("--url", help="API base URL (default: $TORCHYARD_URL, then login)."),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", help="API key (default: $TORCHYARD_API_KEY, then login)."),
    ] = None,
) -> None:
    ctx.obj = {"url": url, "api_key": api_key}


@app.command()
def login(
    url: Annotated[str, typer.Option("--url", prompt="API URL", help="API base URL.")],
    api_key: Annotated[
        str, typer.Option("--api-key", prompt="API key", hide_input=True, help="API key.")
    ],
    verify: Annotated[bool, typer.Option(help="Check the key against the API first.")] = True,
) -> None:
    """Save the API URL and key to the config file (used when no flag or env var is set).

    Example: `torchyard login --url http://127.0.0.1:8000 --api-key ty_...`
    """
    if verify:
        with Client(url, api_key) as client:
            me = client.me()
        out.print(Text(f"key {me.key.prefix or me.key.id} of project {me.project.name}"))
    path = save_config(url.rstrip("/"), api_key)
    out.print(Text(f"saved to {path}"))


@app.command()
def whoami(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Show the URL, project and key in use.

    Example: `torchyard whoami`
    """
    client = command_client(ctx)
    me = client.me()
    if json_out:
        print_json({"url": client.base_url, **me.model_dump(mode="json")})
    else:
        out.print(
            Text(
                f"{client.base_url}: project {me.project.name} ({me.project.id}), "
                f"key {me.key.prefix or me.key.id}"
            )
        )


app.registered_commands += (
    servers_cli.registered_commands
)  # api, worker, exporter, slurm-submitter, controller, beat


def main() -> None:
    """Console-script entry point."""
    app()
