"""Bodies of the audit log route (`api/routes/audit.py`, docs/CONTRACTS.md section 6)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from api.schemas import Timestamp


class AuditEvent(BaseModel):
    """One audited request: a mutating request (POST, PUT, PATCH, DELETE) or a refused one."""

    model_config = ConfigDict(from_attributes=True)

    id: int = Field(description="Grows with time; events are listed by it, newest first.")
    at: Timestamp = Field(description="When the answer was sent; UTC, ISO 8601.")
    actor: str | None = Field(
        description="Who: the API key's name or the OIDC token's subject (or the claim "
        "`TORCHYARD_OIDC_ACTOR_CLAIM` names); null without valid credentials."
    )
    actor_kind: Literal["key", "oidc", "anonymous"] = Field(
        description="How the caller authenticated: an API key, an OIDC token, or not at all."
    )
    key_id: str | None = Field(description="The API key's id, or `oidc:<subject>`.")
    method: str = Field(description="The HTTP method.")
    path: str = Field(description="The request path (without the query string).")
    operation: str | None = Field(
        description="The route's OpenAPI operationId, such as `jobs_create`; null when no "
        "route matched."
    )
    target: str | None = Field(
        description="What it acted on: the first path parameter (a job or dataset id), or the "
        "id of the resource a `201 Created` made; null when neither."
    )
    status_code: int = Field(description="The HTTP status of the answer.")
    outcome: Literal["ok", "denied", "failed"] = Field(
        description="`ok` below 400, `denied` for 401 and 403, `failed` for any other error."
    )
    source: str | None = Field(
        description="The client's address: the socket peer, or from `X-Forwarded-For` behind "
        "`TORCHYARD_TRUSTED_PROXIES` proxies."
    )
    request_id: str | None = Field(description="The answer's `X-Request-ID`.")


class AuditPage(BaseModel):
    items: list[AuditEvent] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null: last.")
