"""Bodies of the quota routes (`api/routes/quotas.py`, docs/CONTRACTS.md section 6)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from api import openapi_examples
from api.schemas import Timestamp
from api.validation import NotBool
from core.scheduling.quotas import QuotaUsage

Limit = Annotated[int, Field(ge=0, le=1_000_000), NotBool] | None


_QUOTA_EXAMPLE = {
    "pool": "a100",
    "max_slots": 2,
    "max_running_jobs": None,
    "max_queued_jobs": 100,
    "monthly_slot_hours": 500.0,
    "weight": 1.0,
    "slots_in_use": 2,
    "running_jobs": 2,
    "queued_jobs": 1,
    "slot_hours_this_month": 131.5,
    "updated_at": "2026-11-25T12:00:00Z",
}


class QuotaIn(BaseModel):
    """A project's limits on one pool (or every pool, `*`) and its fair-share weight there.
    Every field left out or null is no limit; the PUT replaces the whole quota."""

    model_config = ConfigDict(extra="forbid")

    max_slots: Limit = Field(
        default=None, description="Devices (GPUs, CPU slots) the project's active jobs may hold "
        "at once (a job holds `procs_per_node x nodes`).", examples=[2],
    )  # fmt: skip
    max_running_jobs: Limit = Field(
        default=None, description="Active jobs (starting, running, pausing, cancelling) at once.",
        examples=[3],
    )  # fmt: skip
    max_queued_jobs: Limit = Field(
        default=None,
        description="Queued jobs; a submission past it is refused: 429 `quota_exceeded` with "
        "`Retry-After`.",
        examples=[100],
    )
    monthly_slot_hours: Annotated[
        float | None, Field(ge=0, le=1e9, allow_inf_nan=False, strict=True)
    ] = Field(
        default=None,
        description="Slot-hours (GPU-hours on GPU pools: devices x hours) per calendar month "
        "(UTC); once used up, the project's queued jobs wait with `budget exhausted`.",
        examples=[500.0],
    )
    weight: Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False, strict=True)] = Field(
        default=1.0,
        description="Fair share against the other projects of the pool: the claim prefers the "
        "project with the fewest active slots per weight (2 gets twice the slots of 1).",
        examples=[1.0],
    )


class Quota(QuotaIn):
    """A quota and what the project uses against it now."""

    model_config = openapi_examples.config(_QUOTA_EXAMPLE, extra="ignore")

    pool: str = Field(description="The pool it limits; `*` limits every pool together.")
    slots_in_use: int = Field(description="Devices the project's active jobs hold there now.")
    running_jobs: int = Field(description="The project's active jobs there now.")
    queued_jobs: int = Field(description="The project's queued jobs there now.")
    slot_hours_this_month: float = Field(
        description="Slot-hours (GPU-hours) its jobs used there this calendar month (UTC)."
    )
    updated_at: Timestamp = Field(description="When the quota was last set; UTC, ISO 8601.")

    @classmethod
    def of(cls, usage: QuotaUsage) -> Quota:
        row = usage.quota
        return cls(
            pool=row.pool,
            max_slots=row.max_slots,
            max_running_jobs=row.max_running_jobs,
            max_queued_jobs=row.max_queued_jobs,
            monthly_slot_hours=row.monthly_slot_hours,
            weight=row.weight,
            slots_in_use=usage.slots_in_use,
            running_jobs=usage.running_jobs,
            queued_jobs=usage.queued_jobs,
            slot_hours_this_month=round(usage.slot_hours_this_month, 6),
            updated_at=row.updated_at,
        )


class QuotaList(BaseModel):
    model_config = openapi_examples.config({"items": [_QUOTA_EXAMPLE]})

    items: list[Quota] = Field(description="The project's quotas by pool (`*` first).")
