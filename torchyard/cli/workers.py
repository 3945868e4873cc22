"""`torchyard workers`: the deployment's workers, their pools, slots, liveness and sandbox."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import typer
from rich.text import Text

from torchyard.cli.common import JsonOpt, command_client, out, print_json
from torchyard.tables import Column, ListTable
from torchyard.units import format_age
from torchyard.workers import Worker


def workers_table(workers: Iterable[Worker], now: datetime | None = None) -> ListTable:
    """One row per worker: name, pools, host, free/total slots, state (alive, stopping, gone),
    last heartbeat, sandbox (``none: <why>`` in yellow: its jobs can read what it reads; whole,
    under the row when it does not fit). On a narrow terminal the host goes first, then the
    heartbeat."""
    table = ListTable(
        Column("NAME", "name"),
        Column("POOL", "text", drop=3),
        Column("HOST", "text", drop=1),
        Column("SLOTS", "num"),
        Column("STATE", "id"),
        Column("HEARTBEAT", "id", drop=2),
        Column("SANDBOX", "long"),
    )
    for w in workers:
        free = "?" if w.slots_free is None else str(w.slots_free)
        state = "stopping" if w.stopping and w.alive else "alive" if w.alive else "gone"
        style = {"alive": "green", "stopping": "yellow", "gone": "red"}[state]
        sandbox = Text(
            w.sandbox or "-", style="yellow" if (w.sandbox or "").startswith("none") else ""
        )
        table.add_row(
            Text(w.name),
            Text(w.pool),
            Text(w.host),
            f"{free}/{w.slots_total} free",
            Text(state, style=style),
            format_age(w.heartbeat_at, now),
            sandbox,
        )
    return table


def workers_command(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """List the deployment's workers: the pools each serves, free/total slots, whether it is
    alive, and how it sandboxes its jobs (`none: ...` means a job can read what it reads).

    Example: `torchyard workers --json`
    """
    workers = command_client(ctx).workers.list()
    if json_out:
        print_json(workers)
    else:
        out.print(workers_table(workers) if workers else "no workers have reported")
