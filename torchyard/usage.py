"""Usage and cost of the project: slot-seconds (GPU-seconds on GPU pools), CPU-seconds and cost
per UTC day, pool or job (``GET /v1/usage``).

    with Client() as client:
        report = client.usage.get(since="2026-11-01", group_by="pool")
        csv_text = client.usage.csv(since="2026-11-01", group_by="job")

``torchyard usage --since 2026-11-01 --by pool`` prints it as a table.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict

from torchyard.errors import ConnectionFailed, error_from_response
from torchyard.transport import Transport

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
    # pools with usage but no slot-hour price (TORCHYARD_SLOT_PRICES): their hours cost 0
    unpriced_pools: list[str] = []


def _params(since: str | None, until: str | None, group_by: str) -> dict[str, Any]:
    return {"since": since, "until": until, "group_by": group_by}


class Usage:
    """``client.usage``: the project's usage report as typed rows or CSV text."""

    def __init__(self, client: Transport) -> None:
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
            response = self._client.http.get(
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
