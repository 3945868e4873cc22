"""Training sessions of the Tinker-compatible API, read the Torchyard way (`core.sessions.listing`):
the project's sessions with their training clients, jobs and calls. The official client's own
reads are under `/tinker` (`api/routes/tinker_api/sessions.py`)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query

from api.deps import ReadPrincipal, SessionDep
from api.errors import ERROR_RESPONSES
from api.schemas.sessions import SessionModelOut, SessionOut, SessionPage
from core.sessions import listing

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], responses=ERROR_RESPONSES)

SessionId = Annotated[
    str,
    Path(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_-]+$", description="Session id."),
]


@router.get("", response_model=SessionPage, operation_id="sessions_list")
def list_sessions(
    principal: ReadPrincipal,
    session: SessionDep,
    state: Annotated[
        Literal["active", "ended"] | None, Query(description="Only sessions in this state.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200, description="Page size.")] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9, description="Skip this many first.")] = 0,
) -> SessionPage:
    """The project's training sessions, newest first, each with its training clients (the
    session job serving each, its state and step) and its calls by state."""
    rows = listing.page(
        session=session, project_id=principal.project_id, state=state, limit=limit, offset=offset
    )
    return SessionPage(
        items=[_out(s) for s in rows], next_offset=offset + limit if len(rows) == limit else None
    )


@router.get("/{session_id}", response_model=SessionOut, operation_id="sessions_get")
def get_session(session_id: SessionId, principal: ReadPrincipal, session: SessionDep) -> SessionOut:
    """One training session of the project; 404 for another project's."""
    return _out(
        listing.summary(session=session, project_id=principal.project_id, session_id=session_id)
    )


def _out(s: listing.SessionSummary) -> SessionOut:
    row = s.row
    return SessionOut(
        id=row.id,
        state=row.state,
        display_name=row.display_name,
        tags=list(row.tags),
        user_metadata=dict(row.user_metadata),
        sdk_version=row.sdk_version,
        owner=row.owner,
        created_at=row.created_at,
        last_heartbeat_at=row.last_heartbeat_at,
        ended_at=row.ended_at,
        ended_reason=row.ended_reason,
        models=[
            SessionModelOut(
                model_id=m.row.id,
                base_model=m.row.base_model,
                lora_rank=m.row.lora_rank,
                job_id=m.row.job_id,
                job_state=m.job.state if m.job is not None else None,
                current_step=m.job.current_step if m.job is not None else None,
            )
            for m in s.models
        ],
        calls=dict(s.calls),
    )
