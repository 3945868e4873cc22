"""API keys of the caller's project (project admins): list, create (secret shown once), revoke."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from api.deps import AdminPrincipal, SessionDep
from api.errors import ERROR_RESPONSES, LAST_ORG_ADMIN, ErrorBody
from api.redaction import key_out
from api.schemas.access import ID_PATTERN, Key, KeyCreate, KeyCreated, KeyList
from core.access import identity

router = APIRouter(prefix="/v1/keys", tags=["access"], responses=ERROR_RESPONSES)

KeyId = Annotated[
    str, Path(max_length=40, pattern=ID_PATTERN, description="The key's id (`key_...`).")
]


@router.get("", response_model=KeyList)
def list_keys(principal: AdminPrincipal, session: SessionDep) -> KeyList:
    """The project's API keys (revoked and expired too), without secrets or hashes."""
    views = identity.list_keys(session=session, project_id=principal.project_id)
    return KeyList(items=[key_out(view) for view in views])


@router.post(
    "",
    status_code=201,
    response_model=KeyCreated,
    responses={
        403: {
            "model": ErrorBody,
            "description": "`scopes` beyond the owner's role or the caller's",
        },
        409: {"model": ErrorBody, "description": "The service account is disabled"},
    },
)
def create_key(body: KeyCreate, principal: AdminPrincipal, session: SessionDep) -> KeyCreated:
    """Create a key for a member, a service account, or no owner (then with its own `role`).

    The secret is in this answer only. Scopes beyond the owner's role are refused (422)."""
    request = identity.KeyRequest(
        name=body.name,
        scopes=list(body.scopes) if body.scopes is not None else None,
        expires_at=body.expiry(),
        member_id=body.member_id,
        service_account_id=body.service_account_id,
        role=body.role,
    )
    secret, view = identity.create_key(session=session, caller=principal, request=request)
    session.commit()
    return KeyCreated(**key_out(view).model_dump(), secret=secret)


@router.delete("/{key_id}", response_model=Key, responses={409: LAST_ORG_ADMIN})
def revoke_key(key_id: KeyId, principal: AdminPrincipal, session: SessionDep) -> Key:
    """Revoke a key: it answers 401 from the next request on. Revoking twice is harmless; 409
    for the organisation's last active organisation admin key (the caller's own included)."""
    view = identity.revoke_key(session=session, project_id=principal.project_id, key_id=key_id)
    session.commit()
    return key_out(view)
