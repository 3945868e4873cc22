"""Liveness and readiness probes (no auth)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from api import schemas
from api.errors import ErrorBody, error_response
from core.platform.db import SchemaNotMigrated, check_migrated

router = APIRouter(tags=["health"])
log = logging.getLogger("torchyard.api")


@router.get("/healthz", response_model=schemas.Status, operation_id="health_live")
def healthz() -> schemas.Status:
    """The process is up (touches nothing else)."""
    return schemas.Status()


@router.get(
    "/readyz",
    response_model=schemas.Status,
    operation_id="health_ready",
    responses={503: {"model": ErrorBody, "description": "Database unreachable or not migrated"}},
)
def readyz(request: Request) -> schemas.Status | JSONResponse:
    """Ready to serve: the database answers and its schema is at the code's revision."""
    try:
        check_migrated(request.app.state.engine)
    except SchemaNotMigrated as exc:
        return error_response(503, str(exc))
    except SQLAlchemyError as exc:
        log.warning("readyz: database unreachable: %s", exc)
        return error_response(503, f"database unreachable: {type(exc).__name__}")
    return schemas.Status()
