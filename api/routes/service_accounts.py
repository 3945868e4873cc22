"""Service accounts of the caller's project (project admins): CI and platforms with a role."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from api.deps import AdminPrincipal, SessionDep
from api.errors import ERROR_RESPONSES, LAST_ORG_ADMIN, ErrorBody
from api.schemas.access import ID_PATTERN, ServiceAccount, ServiceAccountCreate, ServiceAccountList
from core.access import identity

router = APIRouter(prefix="/v1/service-accounts", tags=["access"], responses=ERROR_RESPONSES)

AccountId = Annotated[
    str, Path(max_length=40, pattern=ID_PATTERN, description="The service account's id (`sa_...`).")
]


@router.get("", response_model=ServiceAccountList)
def list_service_accounts(principal: AdminPrincipal, session: SessionDep) -> ServiceAccountList:
    """The project's service accounts, disabled ones too."""
    accounts = identity.list_service_accounts(session=session, project_id=principal.project_id)
    return ServiceAccountList(items=[ServiceAccount.model_validate(a) for a in accounts])


@router.post(
    "",
    status_code=201,
    response_model=ServiceAccount,
    responses={409: {"model": ErrorBody, "description": "The project has one of that name"}},
)
def create_service_account(
    body: ServiceAccountCreate, principal: AdminPrincipal, session: SessionDep
) -> ServiceAccount:
    """Create a service account with a role; give it keys with `POST /v1/keys`. 409 on a
    name the project already uses."""
    account = identity.create_service_account(
        session=session, project_id=principal.project_id, name=body.name, role=body.role
    )
    session.commit()
    return ServiceAccount.model_validate(account)


@router.delete("/{account_id}", response_model=ServiceAccount, responses={409: LAST_ORG_ADMIN})
def disable_service_account(
    account_id: AccountId, principal: AdminPrincipal, session: SessionDep
) -> ServiceAccount:
    """Disable a service account: all its keys answer 401 from the next request on. 409 when
    one of them is the organisation's last active organisation admin key."""
    account = identity.disable_service_account(
        session=session, project_id=principal.project_id, account_id=account_id
    )
    session.commit()
    return ServiceAccount.model_validate(account)
