"""Training sessions as Torchyard shows them (`GET /v1/sessions`, `torchyard sessions`, the
dashboard): each session with its training clients, the session job serving each and that job's
state and step, and its calls counted by state. The Tinker wire's own reads
(`/tinker/api/v1/sessions`, `core.sessions.service`) answer what the official client expects;
these answer what a team running sessions asks: which are live, what they hold, how far along.

Every function takes the caller's `project_id`: another project's session is NotFound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.platform.tables import Job, SessionModel, SessionRequest, TrainingSession
from core.sessions import samplers, service


@dataclass(frozen=True)
class ModelSummary:
    """A training client (`SessionModel`) and the job serving it (None once deleted)."""

    row: SessionModel
    job: Job | None


@dataclass(frozen=True)
class SessionSummary:
    """A session, its training clients in the order the client made them, and its calls by
    state (`RequestState` values; states with none are left out)."""

    row: TrainingSession
    models: list[ModelSummary] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)


def page(
    *, session: Session, project_id: str, state: str | None, limit: int, offset: int
) -> list[SessionSummary]:
    """The project's sessions, newest first (of `state` when given), `limit` of them after the
    first `offset`."""
    query = select(TrainingSession).where(TrainingSession.project_id == project_id)
    if state is not None:
        query = query.where(TrainingSession.state == state)
    rows = session.scalars(
        query.order_by(TrainingSession.created_at.desc(), TrainingSession.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    return _summaries(session, rows)


def summary(*, session: Session, project_id: str, session_id: str) -> SessionSummary:
    """One session of the project. Raises NotFound (another project's too)."""
    row = service.get(session=session, project_id=project_id, session_id=session_id)
    return _summaries(session, [row])[0]


def _summaries(session: Session, rows: Sequence[TrainingSession]) -> list[SessionSummary]:
    """Two queries for the whole page: the clients with their jobs, and the calls counted."""
    ids = [r.id for r in rows]
    if not ids:
        return []
    models: dict[str, list[ModelSummary]] = {i: [] for i in ids}
    for model, job in session.execute(
        select(SessionModel, Job)
        .outerjoin(Job, Job.id == SessionModel.job_id)
        .where(SessionModel.session_id.in_(ids))
        .order_by(SessionModel.session_id, SessionModel.model_seq_id)
    ):
        models[model.session_id].append(ModelSummary(model, job))
    calls: dict[str, dict[str, int]] = {i: {} for i in ids}
    for session_id, state, count in session.execute(
        select(SessionRequest.session_id, SessionRequest.state, func.count())
        .where(SessionRequest.session_id.in_(ids))
        .group_by(SessionRequest.session_id, SessionRequest.state)
    ):
        calls[session_id][state] = count
    return [SessionSummary(r, models[r.id], calls[r.id]) for r in rows]


def client_ids(*, session: Session, session_id: str) -> tuple[list[str], list[str]]:
    """A session's training clients' model ids (`training_run_ids`, in the order its client
    made them) and its sampling sessions' ids (`sampler_ids`, oldest first), as the Tinker
    client's `GetSessionResponse` lists them. The caller has checked the session's project."""
    models = session.scalars(
        select(SessionModel.id)
        .where(SessionModel.session_id == session_id)
        .order_by(SessionModel.model_seq_id)
    ).all()
    sampling = session.scalars(
        select(SessionRequest.id)
        .where(SessionRequest.session_id == session_id, SessionRequest.kind == samplers.CREATE)
        .order_by(SessionRequest.created_at, SessionRequest.id)
    ).all()
    return list(models), list(sampling)
