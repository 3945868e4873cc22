"""Members of the caller's project and their roles (project admins)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from api.deps import AdminPrincipal, SessionDep
from api.errors import ERROR_RESPONSES, LAST_ORG_ADMIN, ErrorBody
from api.schemas.access import ID_PATTERN, Member, MemberCreate, MemberList, MemberUpdate
from core.access import identity

router = APIRouter(prefix="/v1/members", tags=["access"], responses=ERROR_RESPONSES)

MemberId = Annotated[
    str, Path(max_length=40, pattern=ID_PATTERN, description="The member's id (`mem_...`).")
]


@router.get("", response_model=MemberList)
def list_members(principal: AdminPrincipal, session: SessionDep) -> MemberList:
    """The project's members and their roles."""
    members = identity.list_members(session=session, project_id=principal.project_id)
    return MemberList(items=[Member.model_validate(m) for m in members])


@router.post(
    "",
    status_code=201,
    response_model=Member,
    responses={409: {"model": ErrorBody, "description": "The subject is a member already"}},
)
def add_member(body: MemberCreate, principal: AdminPrincipal, session: SessionDep) -> Member:
    """Add a person by subject (an email or OIDC subject) with a role; 409 if already there."""
    member = identity.add_member(
        session=session, project_id=principal.project_id, subject=body.subject, role=body.role
    )
    session.commit()
    return Member.model_validate(member)


@router.patch("/{member_id}", response_model=Member, responses={409: LAST_ORG_ADMIN})
def update_member(
    member_id: MemberId, body: MemberUpdate, principal: AdminPrincipal, session: SessionDep
) -> Member:
    """Change a member's role; their keys hold the new role from the next request on. 409 when
    that demotes the owner of the organisation's last active organisation admin key."""
    member = identity.set_member_role(
        session=session, project_id=principal.project_id, member_id=member_id, role=body.role
    )
    session.commit()
    return Member.model_validate(member)


@router.delete("/{member_id}", response_model=Member, responses={409: LAST_ORG_ADMIN})
def remove_member(member_id: MemberId, principal: AdminPrincipal, session: SessionDep) -> Member:
    """Remove a member and revoke their keys; answers the removed member. 409 when one of them
    is the organisation's last active organisation admin key."""
    member = identity.remove_member(
        session=session, project_id=principal.project_id, member_id=member_id
    )
    out = Member.model_validate(member)
    session.commit()
    return out
