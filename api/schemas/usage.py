"""Bodies of `GET /v1/usage` (docs/CONTRACTS.md section 6)."""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from api.schemas import Timestamp


class UsageTotals(BaseModel):
    """Slot-seconds, CPU-seconds and cost of some usage."""

    model_config = ConfigDict(from_attributes=True)

    slot_seconds: float = Field(
        description="Slots (GPUs, or CPU slots) x seconds held by nodes of attempts, inside the "
        "window."
    )
    cpu_seconds: float = Field(
        description="CPU time (user + system) of the trainer processes inside the window; a "
        "node's CPU-seconds are spread over its wall time (a node that ran over midnight gives "
        "each day its share)."
    )
    cost: float = Field(
        description="slot-hours x the pool's price per slot-hour (`TORCHYARD_SLOT_PRICES`), in "
        "`currency`; 0 for pools without a price."
    )


class UsageRow(UsageTotals):
    """One group's usage: its key (by `group_by`; the other keys are null) and totals."""

    day: date | None = Field(
        default=None, description="`group_by=day`: the UTC calendar day (YYYY-MM-DD)."
    )
    pool: str | None = Field(
        default=None, description="`group_by=pool`, or the job's pool for `group_by=job`."
    )
    job_id: int | None = Field(default=None, description="`group_by=job`: the job's id.")
    job_name: str | None = Field(default=None, description="`group_by=job`: the job's name.")


class UsageReport(BaseModel):
    """The project's usage in [since, until) per day, pool or job, and the total."""

    since: Timestamp = Field(description="Start of the window (inclusive); UTC, ISO 8601.")
    until: Timestamp = Field(description="End of the window (exclusive); UTC, ISO 8601.")
    group_by: Literal["day", "pool", "job"] = Field(description="How `rows` are grouped.")
    currency: str = Field(description="The unit of every `cost` (`TORCHYARD_CURRENCY`).")
    rows: list[UsageRow] = Field(
        description="One row per day, pool or job with usage in the window, ordered by key."
    )
    total: UsageTotals = Field(description="Every row together.")
    unpriced_pools: list[str] = Field(
        default_factory=list,
        description="Pools with usage in the window but no slot-hour price "
        "(`TORCHYARD_SLOT_PRICES`): their slot-hours cost 0.",
    )
