"""Liveness and readiness probes (no auth)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from api import schemas
from api.errors import ErrorBody, error_response
from core.platform.control import reconciler_health
from core.platform.db import SchemaNotMigrated, check_migrated

router = APIRouter(tags=["health"])
log = logging.getLogger("torchyard.api")


@router.get("/healthz", response_model=schemas.Status, operation_id="health_live")
def healthz() -> schemas.Status:
    """The process is up (touches nothing else)."""
    return schemas.Status()


@router.get(
    "/readyz",
    response_model=schemas.Readiness,
    operation_id="health_ready",
    responses={503: {"model": ErrorBody, "description": "Database unreachable or not migrated"}},
)
def readyz(request: Request) -> schemas.Readiness | JSONResponse:
    """Ready to serve: the database answers and its schema is at the code's revision (else
    503). The answer also says when the reconcile loop last ran (`reconciler`): `status` is
    `degraded` when no controller reconciled for a few intervals; the API still serves."""
    try:
        check_migrated(request.app.state.engine)
        with request.app.state.sessionmaker() as session:
            health = reconciler_health(session, datetime.now(UTC))
    except SchemaNotMigrated as exc:
        return error_response(503, str(exc))
    except SQLAlchemyError as exc:
        log.warning("readyz: database unreachable: %s", exc)
        return error_response(503, f"database unreachable: {type(exc).__name__}")
    return schemas.Readiness(
        status="ok" if health.state == "ok" else "degraded",
        reconciler=schemas.ReconcilerStatus(
            state=health.state,
            reconciled_at=health.reconciled_at,
            seconds_since=None if health.seconds_since is None else round(health.seconds_since, 1),
            leader=health.leader,
            detail=health.detail,
        ),
    )
