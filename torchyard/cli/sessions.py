"""The `torchyard sessions` commands of `torchyard.sessions` (typer, rich): the project's
training sessions of the Tinker-compatible API, their training clients and jobs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

import typer
from rich.text import Text

from torchyard.cli.common import JsonOpt, command_client, out, print_json
from torchyard.tables import Column, ListTable
from torchyard.types import TrainingSession
from torchyard.units import format_age, format_when

sessions_app = typer.Typer(
    help="Training sessions of the Tinker-compatible API (docs/sessions.md).",
    invoke_without_command=True,
)
SessionArg = Annotated[str, typer.Argument(help="Session id (ses_...).", metavar="SESSION")]
StateOpt = Annotated[
    Literal["active", "ended"] | None,
    typer.Option("--state", help="Only active or only ended sessions."),
]


def _calls(session: TrainingSession) -> str:
    done, failed = session.calls.get("done", 0), session.calls.get("failed", 0)
    waiting = session.calls.get("queued", 0) + session.calls.get("running", 0)
    return f"{done} done, {waiting} waiting" + (f", {failed} failed" if failed else "")


def _steps(session: TrainingSession) -> str:
    steps = [m.current_step for m in session.models if m.current_step is not None]
    return str(max(steps)) if steps else "-"


def _sessions_table(sessions: Iterable[TrainingSession]) -> ListTable:
    """One row per session: id, name, state, training clients, steps, calls, last heartbeat;
    the calls and the heartbeat go first on a narrow terminal."""
    table = ListTable(
        Column("ID", "id"),
        Column("NAME", "name"),
        Column("STATE", "id"),
        Column("MODELS", "num"),
        Column("STEPS", "num"),
        Column("CALLS", "text", drop=2),
        Column("HEARTBEAT", "id", drop=1),
    )
    for s in sessions:
        table.add_row(
            s.id,
            Text(s.display_name or "-"),
            s.state,
            str(len(s.models)),
            _steps(s),
            _calls(s),
            format_age(s.last_heartbeat_at) if s.last_heartbeat_at else "-",
        )
    return table


def _models_table(session: TrainingSession) -> ListTable:
    """One row per training client: its model id, base model, rank, job, state and step."""
    table = ListTable(
        Column("MODEL", "id"),
        Column("BASE", "name"),
        Column("RANK", "num"),
        Column("JOB", "num"),
        Column("STATE", "id"),
        Column("STEP", "num"),
    )
    for m in session.models:
        table.add_row(
            m.model_id,
            Text(m.base_model),
            str(m.lora_rank),
            str(m.job_id),
            m.job_state or "-",
            "-" if m.current_step is None else str(m.current_step),
        )
    return table


@sessions_app.callback()
def sessions_main(ctx: typer.Context, state: StateOpt = None, json_out: JsonOpt = False) -> None:
    """The project's training sessions, newest first (the same as `torchyard sessions list`).

    Example: `torchyard sessions --state active`
    """
    if ctx.invoked_subcommand is None:
        _print_list(ctx, state, json_out)


@sessions_app.command("list")
def sessions_list(ctx: typer.Context, state: StateOpt = None, json_out: JsonOpt = False) -> None:
    """The project's training sessions, newest first.

    Example: `torchyard sessions list --state ended`
    """
    _print_list(ctx, state, json_out)


def _print_list(
    ctx: typer.Context, state: Literal["active", "ended"] | None, json_out: bool
) -> None:
    items = command_client(ctx).sessions.list(state=state).items
    if json_out:
        print_json(items)
        return
    out.print(_sessions_table(items) if items else "no sessions")


@sessions_app.command("show")
def sessions_show(ctx: typer.Context, session_id: SessionArg, json_out: JsonOpt = False) -> None:
    """A session: its state, client metadata, training clients with their jobs, and calls.

    Example: `torchyard sessions show ses_4f1c2a9e0b7d`
    """
    session = command_client(ctx).sessions.get(session_id)
    if json_out:
        print_json(session)
        return
    out.print(_sessions_table([session]))
    out.print(Text(f"created {format_when(session.created_at)}, sdk {session.sdk_version}"))
    if session.user_metadata:
        meta = ", ".join(f"{k}={v}" for k, v in sorted(session.user_metadata.items()))
        out.print(Text(f"metadata: {meta}"))
    if session.ended_at is not None:
        out.print(Text(f"ended {format_when(session.ended_at)}: {session.ended_reason or '-'}"))
    if session.models:
        out.print(_models_table(session))
