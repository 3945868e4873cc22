"""Projects of the organisation (organisation admin keys only): create with a first admin key."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import OrgAdminPrincipal, SessionDep
from api.errors import ERROR_RESPONSES, ErrorBody
from api.redaction import key_out
from api.schemas.access import KeyCreated, Project, ProjectCreate, ProjectCreated, ProjectList
from core.access import identity

router = APIRouter(prefix="/v1/projects", tags=["access"], responses=ERROR_RESPONSES)


@router.get("", response_model=ProjectList)
def list_projects(principal: OrgAdminPrincipal, session: SessionDep) -> ProjectList:
    """Every project of the organisation."""
    return ProjectList(
        items=[Project.model_validate(p) for p in identity.list_projects(session=session)]
    )


@router.post(
    "",
    status_code=201,
    response_model=ProjectCreated,
    responses={409: {"model": ErrorBody, "description": "A project has that name"}},
)
def create_project(
    body: ProjectCreate, principal: OrgAdminPrincipal, session: SessionDep
) -> ProjectCreated:
    """Create a project and its first admin key (the secret is in this answer only); 409 when
    the name is taken."""
    project, secret, view = identity.create_project_with_admin(session=session, name=body.name)
    session.commit()
    return ProjectCreated(
        project=Project.model_validate(project),
        key=KeyCreated(**key_out(view).model_dump(), secret=secret),
    )
