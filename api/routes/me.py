"""Who the API key belongs to."""

from __future__ import annotations

from fastapi import APIRouter

from api import schemas
from api.deps import CurrentPrincipal
from api.errors import ERROR_RESPONSES
from core.access import auth

router = APIRouter(prefix="/v1", tags=["me"], responses={401: ERROR_RESPONSES[401]})


@router.get("/me", response_model=schemas.Me)
def me(principal: CurrentPrincipal) -> schemas.Me:
    """The caller's project, API key, role and scopes."""
    return schemas.Me(
        project=schemas.ProjectRef(id=principal.project_id, name=principal.project_name),
        key=schemas.KeyRef(
            id=principal.key_id, name=principal.key_name, prefix=principal.key_prefix
        ),
        role=principal.role.value,
        scopes=[p.value for p in auth.Permission if p.value in principal.scopes],
        org_admin=principal.org_admin,
    )
