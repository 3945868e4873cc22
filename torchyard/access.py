"""Members and API keys of the project (project admins), from Python and the command line.

    with Client() as client:
        ada = client.members.add("ada@example.com", role="member")
        key = client.keys.create("ci", scopes=["jobs:write"], member_id=ada.id, expires_in=86400)
        print(key.secret)                 # shown once: store it now
        client.keys.revoke(key.id)

``torchyard members list|add|remove`` and ``torchyard keys list|create|revoke`` do the same.
"""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from torchyard.transport import Transport

ROLES = ("viewer", "member", "admin")
SCOPES = ("jobs:read", "jobs:write", "datasets:write", "admin")


class Member(BaseModel):
    """A person in the project with a role (`viewer`, `member` or `admin`)."""

    id: str
    subject: str
    role: str
    created_at: datetime


class KeyOwner(BaseModel):
    kind: str  # `member` | `service_account`
    id: str
    name: str


class ApiKey(BaseModel):
    """An API key as the server lists it: never its secret or hash."""

    id: str
    name: str
    prefix: str
    scopes: list[str]
    role: str | None
    owner: KeyOwner | None
    org_admin: bool
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None


class CreatedKey(ApiKey):
    secret: str  # the key itself, shown only when it is created


class Members:
    """``client.members``: who is in the project, with which role. Needs an admin key."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    def list(self) -> builtins.list[Member]:
        """The project's members. Raises `PermissionDenied` without the `admin` scope."""
        answer = self._client.request("GET", "/v1/members")
        return [Member.model_validate(m) for m in answer["items"]]

    def add(self, subject: str, *, role: str) -> Member:
        """Add `subject` (an email or OIDC subject) with `role`. Raises `Conflict` when the
        subject is a member already, `ValidationFailed` for an unknown role."""
        body = {"subject": subject, "role": role}
        return Member.model_validate(self._client.request("POST", "/v1/members", json=body))

    def set_role(self, member_id: str, role: str) -> Member:
        """Change a member's role (effective on their next request). Raises `NotFound`."""
        answer = self._client.request("PATCH", f"/v1/members/{member_id}", json={"role": role})
        return Member.model_validate(answer)

    def remove(self, member_id: str) -> Member:
        """Remove a member and revoke their keys. Raises `NotFound`."""
        return Member.model_validate(self._client.request("DELETE", f"/v1/members/{member_id}"))


class Keys:
    """``client.keys``: the project's API keys. Needs an admin key."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    def list(self) -> builtins.list[ApiKey]:
        """Every key of the project, revoked and expired ones too."""
        answer = self._client.request("GET", "/v1/keys")
        return [ApiKey.model_validate(k) for k in answer["items"]]

    def create(
        self,
        name: str,
        *,
        scopes: builtins.list[str] | None = None,
        member_id: str | None = None,
        service_account_id: str | None = None,
        role: str | None = None,
        expires_in: int | None = None,
    ) -> CreatedKey:
        """A new key; its `secret` is in this answer only. `scopes` default to all the owner's
        role holds; `role` is for an owner-less key only; `expires_in` in seconds. Raises
        `ValidationFailed` for scopes beyond the owner's role or an unknown owner."""
        body: dict[str, Any] = {
            "name": name,
            "scopes": scopes,
            "member_id": member_id,
            "service_account_id": service_account_id,
            "role": role,
            "expires_in": expires_in,
        }
        body = {k: v for k, v in body.items() if v is not None}
        return CreatedKey.model_validate(self._client.request("POST", "/v1/keys", json=body))

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key (401 from its next request on). Raises `NotFound`."""
        return ApiKey.model_validate(self._client.request("DELETE", f"/v1/keys/{key_id}"))
