"""Usage and cost of the caller's project: slot-seconds, CPU-seconds and cost per day, pool or
job, as JSON or CSV."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response

from api.deps import ReadPrincipal, SessionDep, SettingsDep
from api.errors import ERROR_RESPONSES
from api.schemas.usage import UsageReport, UsageRow, UsageTotals
from api.validation import IsoDatetime
from core.platform.errors import InvalidInput
from core.usage import accounting as usage
from core.usage import report as usage_report

router = APIRouter(prefix="/v1", tags=["usage"], responses=ERROR_RESPONSES)

MAX_WINDOW = timedelta(days=400)
CSV_FIELDS = {
    "day": ["day"],
    "pool": ["pool"],
    "job": ["job_id", "job_name", "pool"],
}
TOTAL_FIELDS = ["slot_seconds", "cpu_seconds", "cost", "currency"]

_EXAMPLE = {
    "since": "2026-11-01T00:00:00Z",
    "until": "2026-12-01T00:00:00Z",
    "group_by": "day",
    "currency": "USD",
    "rows": [
        {"day": "2026-11-24", "slot_seconds": 7200.0, "cpu_seconds": 5400.5, "cost": 4.0},
        {"day": "2026-11-25", "slot_seconds": 3600.0, "cpu_seconds": 2710.0, "cost": 2.0},
    ],
    "total": {"slot_seconds": 10800.0, "cpu_seconds": 8110.5, "cost": 6.0},
    "unpriced_pools": [],
}
_CSV_EXAMPLE = (
    "day,slot_seconds,cpu_seconds,cost,currency\n"
    "2026-11-24,7200.0,5400.5,4.0,USD\n2026-11-25,3600.0,2710.0,2.0,USD\n"
)


@router.get(
    "/usage",
    response_model=UsageReport,
    operation_id="usage_get",
    responses={
        200: {
            "description": "The report: JSON, or CSV with a header row (`format=csv` or "
            "`Accept: text/csv`).",
            "content": {
                "application/json": {"example": _EXAMPLE},
                "text/csv": {"schema": {"type": "string"}, "example": _CSV_EXAMPLE},
            },
        }
    },
)
def get_usage(
    principal: ReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
    since: Annotated[
        IsoDatetime | None,
        Query(
            description="Window start, inclusive (ISO 8601; UTC when no offset). Default: "
            "the first day of this calendar month, 00:00 UTC."
        ),
    ] = None,
    until: Annotated[
        IsoDatetime | None,
        Query(
            description="Window end, exclusive. Default: the first day of next month. At "
            "most 400 days after `since`."
        ),
    ] = None,
    group_by: Annotated[
        Literal["day", "pool", "job"], Query(description="One row per UTC day, pool or job.")
    ] = "day",
    format: Annotated[
        Literal["json", "csv"] | None,
        Query(description="`csv` for CSV; default JSON, or CSV for `Accept: text/csv`."),
    ] = None,
    accept: Annotated[str | None, Header(description="`text/csv` asks for CSV.")] = None,
) -> Any:
    """The project's slot-seconds (GPU-seconds on GPU pools), CPU-seconds and cost in
    [since, until), per UTC day, pool or job; a running job counts up to now."""
    start = _utc("since", since) if since is not None else usage.month_start()
    end = _utc("until", until) if until is not None else _next_month(usage.month_start())
    if end - start > MAX_WINDOW:
        msg = f"the window is at most {MAX_WINDOW.days} days"
        raise InvalidInput(
            msg, details=[{"loc": ["query", "until"], "msg": msg, "type": "value_error"}]
        )
    found = usage_report.report(
        session=session,
        project_id=principal.project_id,
        since=start,
        until=end,
        group_by=group_by,
        prices=settings.slot_prices,
        currency=settings.currency,
    )
    body = UsageReport(
        since=found.since,
        until=found.until,
        group_by=found.group_by,
        currency=found.currency,
        rows=[UsageRow.model_validate(r) for r in found.rows],
        total=UsageTotals.model_validate(found.total),
        unpriced_pools=found.unpriced_pools,
    )
    wants_csv = format == "csv" or (format is None and "text/csv" in (accept or ""))
    if wants_csv:
        return Response(_csv(body), media_type="text/csv; charset=utf-8")
    return body


def _utc(param: str, value: datetime) -> datetime:
    """`value` in UTC; InvalidInput (422 at `["query", param]`) when that leaves the calendar
    (0001-01-01T00:00+01:00)."""
    try:
        return usage.as_utc(value)
    except OverflowError:
        msg = "out of range once converted to UTC"
        raise InvalidInput(
            f"{param}: {msg}",
            details=[{"loc": ["query", param], "msg": msg, "type": "value_error"}],
        ) from None


def _next_month(start: datetime) -> datetime:
    return usage.month_start(start.replace(day=1) + timedelta(days=32))


def _csv(body: UsageReport) -> str:
    """The rows as CSV: the group's key columns, then the totals and the currency."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    keys = CSV_FIELDS[body.group_by]
    writer.writerow([*keys, *TOTAL_FIELDS])
    for row in body.rows:
        values = row.model_dump()
        writer.writerow(
            [
                *("" if values[k] is None else values[k] for k in keys),
                row.slot_seconds,
                row.cpu_seconds,
                row.cost,
                body.currency,
            ]
        )
    return out.getvalue()
