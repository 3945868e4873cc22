"""The `torchyard` commands of `torchyard.access` (typer, rich): the SDK part stays there,
importing neither."""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import RenderableType

from torchyard.access import (
    SCOPES,
)
from torchyard.cli.common import JsonOpt, command_client, out
from torchyard.tables import Column, ListTable

# --- command line -----------------------------------------------------------------------------

keys_app = typer.Typer(no_args_is_help=True, help="API keys of the project (admins).")
members_app = typer.Typer(no_args_is_help=True, help="Members of the project and their roles.")


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value else "-"


def _print(items: builtins.list[Any], json_out: bool, table: RenderableType) -> None:
    if json_out:
        typer.echo("[" + ",".join(i.model_dump_json() for i in items) + "]")
    else:
        out.print(table if items else "none")


def keys_table(keys: Iterable[Any]) -> ListTable:
    """One row per API key: id (whole: `keys revoke` takes it), name, prefix, role, scopes,
    owner, expiry, last use, `revoked`; scopes, then last use, owner and prefix go first when
    narrow."""
    table = ListTable(
        Column("ID", "id"),
        Column("NAME", "name"),
        Column("PREFIX", "id", drop=4),
        Column("ROLE", "id", drop=6),
        Column("SCOPES", "text", drop=1),
        Column("OWNER", "text", drop=3),
        Column("EXPIRES", "id", drop=5),
        Column("LAST USED", "id", drop=2),
        Column("", "id"),
    )
    for k in keys:
        owner = f"{k.owner.kind}:{k.owner.name}" if k.owner else "-"
        state = "revoked" if k.revoked_at else ""
        table.add_row(k.id, k.name, k.prefix, k.role or "-", ",".join(k.scopes), owner,
                      _when(k.expires_at), _when(k.last_used_at), state)  # fmt: skip
    return table


@keys_app.command("list")
def keys_list(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """List the project's API keys (never their secrets).

    Example: torchyard keys list --json
    """
    items = command_client(ctx).keys.list()
    table = keys_table(items)
    _print(items, json_out, table)


@keys_app.command("create")
def keys_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A name for the key.")],
    scope: Annotated[
        builtins.list[str] | None,
        typer.Option("--scope", help=f"Repeatable: {', '.join(SCOPES)} (default: the role's)."),
    ] = None,
    member: Annotated[str | None, typer.Option("--member", help="Owner: a member id.")] = None,
    service_account: Annotated[
        str | None, typer.Option("--service-account", help="Owner: a service account id.")
    ] = None,
    role: Annotated[
        str | None, typer.Option("--role", help="Owner-less keys only: viewer|member|admin.")
    ] = None,
    expires_in: Annotated[
        int | None, typer.Option("--expires-in", help="Seconds until it expires.", min=60)
    ] = None,
) -> None:
    """Create an API key and print its secret (shown once).

    Example: torchyard keys create ci --service-account sa_0123 --scope jobs:write
    """
    key = command_client(ctx).keys.create(
        name,
        scopes=scope or None,
        member_id=member,
        service_account_id=service_account,
        role=role,
        expires_in=expires_in,
    )
    typer.echo(f"created {key.id} ({key.role}, {','.join(key.scopes)}); the secret, shown once:",
               err=True)  # fmt: skip
    typer.echo(key.secret)


@keys_app.command("revoke")
def keys_revoke(
    ctx: typer.Context, key_id: Annotated[str, typer.Argument(help="Key id (key_...).")]
) -> None:
    """Revoke an API key: it is refused from its next request on.

    Example: torchyard keys revoke key_0123456789abcdef
    """
    key = command_client(ctx).keys.revoke(key_id)
    typer.echo(f"revoked {key.id} ({key.name})")


@members_app.command("list")
def members_list(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """List the project's members and their roles.

    Example: torchyard members list
    """
    items = command_client(ctx).members.list()
    table = ListTable(
        Column("ID", "id"),
        Column("SUBJECT", "name"),
        Column("ROLE", "id"),
        Column("ADDED", "id", drop=1),
    )
    for m in items:
        table.add_row(m.id, m.subject, m.role, _when(m.created_at))
    _print(items, json_out, table)


@members_app.command("add")
def members_add(
    ctx: typer.Context,
    subject: Annotated[str, typer.Argument(help="An email or OIDC subject.")],
    role: Annotated[str, typer.Option("--role", help="viewer | member | admin.")] = "member",
) -> None:
    """Add a member with a role.

    Example: torchyard members add ada@example.com --role viewer
    """
    member = command_client(ctx).members.add(subject, role=role)
    typer.echo(f"added {member.id} ({member.subject}, {member.role})")


@members_app.command("remove")
def members_remove(
    ctx: typer.Context, member_id: Annotated[str, typer.Argument(help="Member id (mem_...).")]
) -> None:
    """Remove a member; their keys are revoked.

    Example: torchyard members remove mem_0123456789abcdef
    """
    member = command_client(ctx).members.remove(member_id)
    typer.echo(f"removed {member.id} ({member.subject})")
