"""Usage and cost of the project: slot-seconds (GPU-seconds on GPU pools), CPU-seconds and cost
per UTC day, pool or job (``GET /v1/usage``).

    with Client() as client:
        report = client.usage.get(since="2026-11-01", group_by="pool")
        csv_text = client.usage.csv(since="2026-11-01", group_by="job")

``torchyard usage --since 2026-11-01 --by pool`` prints it as a table.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import httpx
import typer
from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.table import Table
from rich.text import Text

from torchyard.errors import ConnectionFailed, error_from_response

if TYPE_CHECKING:
    from torchyard.client import Client

GroupBy = Literal["day", "pool", "job"]
KEY_COLUMNS: dict[str, list[str]] = {
    "day": ["day"],
    "pool": ["pool"],
    "job": ["job_id", "job_name", "pool"],
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class UsageTotals(_Model):
    """Slot-seconds, CPU-seconds and cost (in the report's currency)."""

    slot_seconds: float
    cpu_seconds: float
    cost: float


class UsageRow(UsageTotals):
    """One day's, pool's or job's usage; the keys that are not the grouping are None."""

    day: date | None = None
    pool: str | None = None
    job_id: int | None = None
    job_name: str | None = None


class UsageReport(_Model):
    """The project's usage in [since, until) grouped by `group_by`, and the total."""

    since: datetime
    until: datetime
    group_by: str
    currency: str
    rows: list[UsageRow]
    total: UsageTotals


def _params(since: str | None, until: str | None, group_by: str) -> dict[str, Any]:
    return {"since": since, "until": until, "group_by": group_by}


class Usage:
    """``client.usage``: the project's usage report as typed rows or CSV text."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def get(
        self, *, since: str | None = None, until: str | None = None, group_by: GroupBy = "day"
    ) -> UsageReport:
        """The report (default window: this calendar month). `since`/`until`: ISO 8601 dates
        or times, UTC unless they name an offset. Raises `ValidationFailed` for bad values."""
        answer = self._client.request("GET", "/v1/usage", params=_params(since, until, group_by))
        return UsageReport.model_validate(answer)

    def csv(
        self, *, since: str | None = None, until: str | None = None, group_by: GroupBy = "day"
    ) -> str:
        """The report as the server's CSV (a header row, then one line per group)."""
        params = {k: v for k, v in _params(since, until, group_by).items() if v is not None}
        try:
            response = self._client._http.get(
                "/v1/usage", params={**params, "format": "csv"}, headers={"Accept": "text/csv"}
            )
        except httpx.TransportError as exc:
            raise ConnectionFailed(
                f"cannot reach the API at {self._client.base_url}: {exc}"
            ) from exc
        if not response.is_success:
            try:
                body = response.json()
            except ValueError:
                body = None
            raise error_from_response(response.status_code, body, response.text)
        return response.text


def usage_table(report: UsageReport) -> Table:
    """One row per group (hours, not seconds) and a total row."""
    keys = KEY_COLUMNS.get(report.group_by, [report.group_by])
    table = Table(box=None, header_style="bold", show_footer=True)
    titles = {"day": "DAY", "pool": "POOL", "job_id": "JOB", "job_name": "NAME"}
    for i, key in enumerate(keys):
        table.add_column(titles.get(key, key.upper()), footer="total" if i == 0 else "")
    total = report.total
    table.add_column("SLOT-HOURS", justify="right", footer=_hours(total.slot_seconds))
    table.add_column("CPU-HOURS", justify="right", footer=_hours(total.cpu_seconds))
    table.add_column(f"COST ({report.currency})", justify="right", footer=f"{total.cost:.2f}")
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
    from torchyard.client import Client  # torchyard.client imports this module

    if by not in KEY_COLUMNS:
        raise typer.BadParameter("one of day, pool, job", param_hint="--by")
    root = ctx.find_root().obj or {}
    usage = ctx.with_resource(Client(root.get("url"), root.get("api_key"))).usage
    group: Any = by
    if csv_out:
        typer.echo(usage.csv(since=since, until=until, group_by=group), nl=False)
        return
    report = usage.get(since=since, until=until, group_by=group)
    if json_out:
        typer.echo(report.model_dump_json(indent=2))
        return
    console = Console(soft_wrap=True)
    console.print(
        Text(
            f"usage {report.since:%Y-%m-%d %H:%M} to {report.until:%Y-%m-%d %H:%M} UTC",
            style="bold",
        )
    )
    console.print(usage_table(report) if report.rows else "no usage in this window")
