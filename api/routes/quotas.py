"""Quotas: read the project's limits with their usage (readers), set them (admins)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Request

from api.deps import AdminPrincipal, ReadPrincipal, SessionDep
from api.errors import ERROR_RESPONSES, ErrorBody
from api.schemas.quotas import Quota, QuotaIn, QuotaList
from core.scheduling import quotas

router = APIRouter(prefix="/v1/quotas", tags=["quotas"], responses=ERROR_RESPONSES)

PoolName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=100,
        pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9._-]*)$",
        description="A pool's name (`resources.pool`), or `*` for every pool together.",
        examples=["default"],
    ),
]
_FORBIDDEN: dict[int | str, dict[str, Any]] = {
    403: {"model": ErrorBody, "description": "The caller is not an admin of the project"}
}
_EXAMPLE = {"max_slots": 2, "max_running_jobs": 3, "max_queued_jobs": 100, "weight": 1.0}


@router.get("", response_model=QuotaList, operation_id="quotas_get", responses=_FORBIDDEN)
def get_quotas(principal: ReadPrincipal, session: SessionDep) -> QuotaList:
    """The project's quotas per pool, each with what the project uses against it now (slots
    in use, active and queued jobs, slot-hours this month). No row: no limit, weight 1."""
    rows = quotas.list_quotas(session=session, project_id=principal.project_id)
    return QuotaList(items=[Quota.of(row) for row in rows])


@router.put("/{pool}", response_model=Quota, operation_id="quotas_set", responses=_FORBIDDEN)
def set_quota(
    pool: PoolName,
    body: Annotated[QuotaIn, Body(openapi_examples={"two GPUs": {"value": _EXAMPLE}})],
    principal: AdminPrincipal,
    session: SessionDep,
    request: Request,
) -> Quota:
    """Set the project's quota on one pool (`*`: every pool together), replacing it: limits
    left out are no limit. Enforced from the next claim on; queued jobs over it wait with the
    reason (`GET /v1/jobs/{id}`: `queue.reason`)."""
    usage = quotas.put_quota(
        session=session, project_id=principal.project_id, pool=pool, values=body.model_dump()
    )
    # A raised limit may free waiting jobs now, not at the reconciler's next re-send.
    for job in quotas.waiting_heads(session=session, project_id=principal.project_id, pool=pool):
        request.app.state.dispatcher.dispatch(job)
    return Quota.of(usage)
