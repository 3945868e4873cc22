"""The audit log of the caller's project: who did what, to what, when, from where."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import AdminPrincipal, SessionDep
from api.errors import ERROR_RESPONSES, ErrorBody
from api.schemas.audit import AuditEvent, AuditPage
from api.validation import IsoDatetime
from core.access import audit
from core.platform.errors import InvalidInput

_NO_NUL = r"^[^\x00]*$"  # Postgres text cannot hold NUL
router = APIRouter(prefix="/v1", tags=["audit"], responses=ERROR_RESPONSES)

_EXAMPLE = {
    "items": [
        {
            "id": 812,
            "at": "2026-11-25T12:03:44.120000Z",
            "actor": "ci-bot",
            "actor_kind": "key",
            "key_id": "key_4f1c2a9e0b7d3c55",
            "method": "POST",
            "path": "/v1/jobs",
            "operation": "jobs_create",
            "target": "1043",
            "status_code": 201,
            "outcome": "ok",
            "source": "10.0.3.17",
            "request_id": "9f2c1e0a7b3d4c55",
        }
    ],
    "next_cursor": "eyJiZWZvcmVfaWQiOjgxMn0",
}


@router.get(
    "/audit",
    response_model=AuditPage,
    operation_id="audit_list",
    responses={
        200: {"content": {"application/json": {"example": _EXAMPLE}}},
        403: {"model": ErrorBody, "description": "The caller's role or scopes lack `admin`"},
    },
)
def list_audit(
    principal: AdminPrincipal,
    session: SessionDep,
    actor: Annotated[
        str | None, Query(max_length=255, pattern=_NO_NUL, description="Only this actor (exact).")
    ] = None,
    operation: Annotated[
        str | None,
        Query(
            max_length=100,
            pattern=_NO_NUL,
            description="Only this operationId, e.g. `jobs_create`.",
        ),
    ] = None,
    outcome: Annotated[
        audit.Outcome | None, Query(description="Only `ok`, `denied` or `failed` events.")
    ] = None,
    target: Annotated[
        str | None,
        Query(max_length=200, pattern=_NO_NUL, description="Only events on this target (exact)."),
    ] = None,
    since: Annotated[
        IsoDatetime | None, Query(description="Only events at or after this time (ISO 8601).")
    ] = None,
    until: Annotated[
        IsoDatetime | None, Query(description="Only events before this time (ISO 8601).")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Events per page.")] = 100,
    cursor: Annotated[
        str | None, Query(max_length=100, description="`next_cursor` of the previous page.")
    ] = None,
) -> AuditPage:
    """List the project's audit events (mutating requests and refusals), newest first; admins
    only."""
    items, before_id = audit.list_page(
        session=session,
        project_id=principal.project_id,
        actor=actor,
        operation=operation,
        outcome=outcome,
        target=target,
        since=since,
        until=until,
        limit=limit,
        before_id=_decode(cursor) if cursor is not None else None,
    )
    return AuditPage(
        items=[AuditEvent.model_validate(item) for item in items],
        next_cursor=_encode(before_id) if before_id is not None else None,
    )


def _encode(before_id: int) -> str:
    raw = json.dumps({"before_id": before_id}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str) -> int:
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        before_id = value["before_id"] if isinstance(value, dict) else None
    except (binascii.Error, ValueError, TypeError, KeyError):
        before_id = None
    if type(before_id) is not int or not 1 <= before_id <= 2**63 - 1:
        raise InvalidInput(
            "cursor: not a cursor this API returned",
            details=[
                {"loc": ["query", "cursor"], "msg": "malformed cursor", "type": "value_error"}
            ],
        )
    return before_id
