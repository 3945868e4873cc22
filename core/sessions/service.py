"""Training sessions of the Tinker-compatible API (issue 47): create, read, heartbeat, idle out.

A session is one client's `ServiceClient`: the official `tinker` client creates it at start
(`POST /tinker/api/v1/create_session`) and heartbeats it every 10 s. Every function takes the
caller's `project_id` and finds sessions only inside it, so another project's session raises
NotFound exactly like an unknown id. A session is `active` until its client has been silent for
`session_idle_timeout_s` (`end_idle`, run by the reconcile loop) or closes it (`finish`);
then `ended`, for good: a
heartbeat for it raises Gone (410), which stops the client's heartbeat loop
(docs/TINKER-WIRE.md, "Start-up sequence").

Its training clients (`create_model`) are session jobs (`core.sessions.training_clients`); when the
session ends, by `finish` or idling out, they are cancelled and its unanswered calls fail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.access.auth import new_id
from core.platform.errors import Gone, NotFound
from core.platform.tables import SessionState, TrainingSession, utcnow
from core.sessions import training_clients

ID_PREFIX = "ses"


@dataclass(frozen=True)
class NewSession:
    """What a client asks for (`CreateSessionRequest`), already validated at the edge."""

    tags: Sequence[str]
    user_metadata: dict[str, Any]
    sdk_version: str
    display_name: str | None = None


def create(
    *,
    session: Session,
    project_id: str,
    owner: str | None,
    new: NewSession,
    request_key: str | None = None,
    now: datetime | None = None,
) -> TrainingSession:
    """A new active session of the project, or, when `request_key` (the client's
    `X-Idempotency-Key`) made one before, that one: a retried create makes one session. No
    commit."""
    if request_key is not None:
        earlier = _by_request_key(session, project_id, request_key)
        if earlier is not None:
            return earlier
    now = now or utcnow()
    row = TrainingSession(
        id=new_id(ID_PREFIX),
        project_id=project_id,
        owner=owner,
        state=SessionState.ACTIVE,
        tags=sorted(set(new.tags)),
        user_metadata=dict(new.user_metadata),
        display_name=new.display_name,
        sdk_version=new.sdk_version,
        request_key=request_key,
        created_at=now,
        last_heartbeat_at=now,
    )
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:  # the same retry, inserted by another request first
        earlier = _by_request_key(session, project_id, request_key) if request_key else None
        if earlier is None:
            raise
        return earlier
    return row


def _by_request_key(session: Session, project_id: str, key: str) -> TrainingSession | None:
    query = select(TrainingSession).where(
        TrainingSession.project_id == project_id, TrainingSession.request_key == key
    )
    return session.scalars(query).one_or_none()


def get(*, session: Session, project_id: str, session_id: str) -> TrainingSession:
    """The project's session `session_id`. Raises NotFound (another project's too)."""
    row = session.get(TrainingSession, session_id)
    if row is None or row.project_id != project_id:
        raise NotFound(f"session {session_id[:100]!r} not found")
    return row


def list_ids(*, session: Session, project_id: str, limit: int, offset: int) -> list[str]:
    """The project's session ids, newest first, `limit` of them after the first `offset`."""
    query = (
        select(TrainingSession.id)
        .where(TrainingSession.project_id == project_id)
        .order_by(TrainingSession.created_at.desc(), TrainingSession.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return list(session.scalars(query))


def heartbeat(
    *, session: Session, project_id: str, session_id: str, now: datetime | None = None
) -> TrainingSession:
    """Record the client's heartbeat at `now`. Raises NotFound for a session not of the
    project, Gone (410) for an ended one: its client stops heartbeating. No commit."""
    now = now or utcnow()
    done = session.execute(
        update(TrainingSession)
        .where(
            TrainingSession.id == session_id,
            TrainingSession.project_id == project_id,
            TrainingSession.state == SessionState.ACTIVE,
        )
        .values(last_heartbeat_at=now)
        .execution_options(synchronize_session=False)
    )
    row = get(session=session, project_id=project_id, session_id=session_id)
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise Gone(f"session {session_id} has ended: {row.ended_reason or 'ended'}")
    session.refresh(row)
    return row


def finish(
    *, session: Session, project_id: str, session_id: str, reason: str, now: datetime | None = None
) -> TrainingSession:
    """End the session because its client closed it (`ServiceClient.close`, or leaving its
    `with` block): `reason` is kept unless it had ended already (the first reason wins).
    Raises NotFound for a session not of the project. No commit."""
    row = get(session=session, project_id=project_id, session_id=session_id)
    session.execute(
        update(TrainingSession)
        .where(TrainingSession.id == row.id, TrainingSession.state == SessionState.ACTIVE)
        .values(state=SessionState.ENDED, ended_at=now or utcnow(), ended_reason=reason)
        .execution_options(synchronize_session=False)
    )
    session.refresh(row)
    training_clients.stop_jobs(session=session, session_ids=[row.id])
    return row


def end_idle(*, session: Session, idle_timeout_s: float, now: datetime | None = None) -> list[str]:
    """End every active session whose last heartbeat is more than `idle_timeout_s` seconds
    before `now` (its client is gone), in one UPDATE: a heartbeat that commits first keeps its
    session. Their session jobs are cancelled (`core.sessions.training_clients.stop_jobs`).
    Returns the ended ids. No commit."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=idle_timeout_s)
    ended = session.execute(
        update(TrainingSession)
        .where(
            TrainingSession.state == SessionState.ACTIVE,
            TrainingSession.last_heartbeat_at < cutoff,
        )
        .values(
            state=SessionState.ENDED,
            ended_at=now,
            ended_reason=f"idle: no heartbeat for {idle_timeout_s:g} s",
        )
        .returning(TrainingSession.id)
        .execution_options(synchronize_session=False)
    )
    ids = sorted(ended.scalars())
    training_clients.stop_jobs(session=session, session_ids=ids)
    return ids
