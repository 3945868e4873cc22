"""The `torchyard` commands of `torchyard.usage` (typer, rich): the SDK part stays there,
importing neither."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

import typer
from rich.text import Text

from torchyard.cli.common import command_client, out
from torchyard.tables import Column, ListTable
from torchyard.usage import (
    KEY_COLUMNS,
    UsageReport,
)

_KEY_COLUMNS = {
    "day": Column("DAY", "id"),
    "pool": Column("POOL", "name"),
    "job_id": Column("JOB", "num"),
    "job_name": Column("NAME", "name"),
}


def usage_table(report: UsageReport) -> ListTable:
    """One row per group (hours, not seconds) and a total row."""
    keys = KEY_COLUMNS.get(report.group_by, [report.group_by])
    key_columns = [_KEY_COLUMNS.get(key, Column(key.upper(), "name")) for key in keys]
    total = report.total
    table = ListTable(
        *(replace(c, footer="total" if i == 0 else "") for i, c in enumerate(key_columns)),
        Column("SLOT-HOURS", "num", footer=_hours(total.slot_seconds)),
        Column("CPU-HOURS", "num", footer=_hours(total.cpu_seconds)),
        Column(f"COST ({report.currency})", "num", footer=f"{total.cost:.2f}"),
    )
    for row in report.rows:
        cells = ["-" if getattr(row, k) is None else str(getattr(row, k)) for k in keys]
        table.add_row(
            *(Text(c) for c in cells),
            _hours(row.slot_seconds),
            _hours(row.cpu_seconds),
            f"{row.cost:.2f}",
        )
    return table


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def usage_command(
    ctx: typer.Context,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Window start (2026-11-01 or an ISO time; UTC). Default: the first of this month.",
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Window end, exclusive. Default: the first of next month."),
    ] = None,
    by: Annotated[
        str, typer.Option("--by", help="One row per day, pool or job.", case_sensitive=False)
    ] = "day",
    csv_out: Annotated[bool, typer.Option("--csv", help="Print the server's CSV.")] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print JSON instead of a table.")
    ] = False,
) -> None:
    """Show the project's slot-hours (GPU-hours on GPU pools), CPU-hours and cost per UTC
    day, pool or job; a running job counts up to now.

    Examples: `torchyard usage --since 2026-11-01 --by pool` (this month, per pool);
    `torchyard usage --by job --csv > usage.csv` (per job, for a spreadsheet).
    """
    if by not in KEY_COLUMNS:
        raise typer.BadParameter("one of day, pool, job", param_hint="--by")
    usage = command_client(ctx).usage
    group: Any = by
    if csv_out:
        typer.echo(usage.csv(since=since, until=until, group_by=group), nl=False)
        return
    report = usage.get(since=since, until=until, group_by=group)
    if json_out:
        typer.echo(report.model_dump_json(indent=2))
        return
    out.print(
        Text(
            f"usage {report.since:%Y-%m-%d %H:%M} to {report.until:%Y-%m-%d %H:%M} UTC",
            style="bold",
        )
    )
    out.print(usage_table(report) if report.rows else "no usage in this window")
    if report.unpriced_pools:
        out.print(Text(no_price_note(report.unpriced_pools), style="yellow"))
    out.print(Text(SLOT_HOURS, style="dim"))


SLOT_HOURS = (
    "slot-hours: devices (GPUs, or CPU slots) x hours held by a job's nodes; "
    "a running job counts up to now"
)


def no_price_note(pools: list[str]) -> str:
    """What a report says of `pools` used without a slot-hour price."""
    named = ", ".join(pools)
    return (
        f"no price set for pool{'s' if len(pools) > 1 else ''} {named} "
        "(TORCHYARD_SLOT_PRICES): their slot-hours cost 0"
    )
