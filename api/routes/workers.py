"""The deployment's workers: pools, slots, liveness and how each contains its jobs."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Request
from sqlalchemy import select

from api.deps import ReadPrincipal, SessionDep
from api.errors import ERROR_RESPONSES
from api.schemas.workers import WorkerList, WorkerOut
from core.platform.tables import Worker, utcnow
from core.usage.accounting import as_utc

router = APIRouter(prefix="/v1/workers", tags=["workers"], responses=ERROR_RESPONSES)


@router.get("", response_model=WorkerList, operation_id="workers_list")
def list_workers(principal: ReadPrincipal, session: SessionDep, request: Request) -> WorkerList:
    """Every worker, newest heartbeat first (rows unwritten for a week are dropped): its
    pools, slots, whether it is alive, and whether it sandboxes its jobs (`sandbox`). Workers
    serve every project: any key that can read sees them."""
    del principal  # any reader: the workers are the deployment's, not a project's
    timeout = timedelta(seconds=request.app.state.settings.worker_timeout_s)
    now = utcnow()
    rows = session.scalars(select(Worker).order_by(Worker.heartbeat_at.desc(), Worker.name))
    return WorkerList(
        items=[
            WorkerOut(
                name=w.name,
                pool=w.pool,
                host=w.host,
                slots_total=w.slots_total,
                slots_free=w.slots_free,
                started_at=w.started_at,
                heartbeat_at=w.heartbeat_at,
                alive=now - as_utc(w.heartbeat_at) <= timeout,
                stopping=w.stopping,
                sandbox=w.sandbox,
            )
            for w in rows
        ]
    )
