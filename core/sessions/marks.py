"""A training client's named states after they were saved (issue 47): `delete_checkpoint`,
`set_checkpoint_ttl` and `publish_checkpoint` / `unpublish_checkpoint` of the Tinker client's
`RestClient`.

Only the session program writes a state's bytes and its name (`tinker_names.json` in the job's
checkpoint directory); what is decided later is a `StateMark` row. A deleted state, or one whose
`expires_at` has passed, is gone for every read (`runs.saved_states`, the loads of
`training_clients.saved_state`): expiry needs no sweeper. Its bytes stay with the job's
checkpoints, which a preempted session job may resume from.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.platform.errors import NotFound
from core.platform.tables import StateMark, aware, utcnow

MIN_TTL_S = 3600
MAX_TTL_S = 10 * 365 * 86400
"""The client's documented range of `ttl_seconds`: one hour to ten years."""


def of(session: Session, model_id: str) -> dict[str, StateMark]:
    """The marks of training client `model_id`, by state name."""
    rows = session.scalars(select(StateMark).where(StateMark.model_id == model_id))
    return {row.name: row for row in rows}


def gone(mark: StateMark | None) -> bool:
    """Whether a state with `mark` is deleted or past its expiry."""
    if mark is None:
        return False
    if mark.deleted_at is not None:
        return True
    return mark.expires_at is not None and aware(mark.expires_at) <= aware(utcnow())


def published(mark: StateMark | None) -> bool:
    """Whether a state with `mark` is published (and not gone)."""
    return mark is not None and mark.published_at is not None and not gone(mark)


def check_present(session: Session, model_id: str, name: str) -> None:
    """Raises NotFound when the state `name` of `model_id` was deleted or has expired."""
    if gone(session.get(StateMark, (model_id, name))):
        raise NotFound(f"training run {model_id[:100]!r} has no state {name[:100]!r}")


def _mark(session: Session, model_id: str, name: str) -> StateMark:
    row = session.get(StateMark, (model_id, name))
    if row is None:
        row = StateMark(model_id=model_id, name=name)
        session.add(row)
    return row


def delete(session: Session, model_id: str, name: str) -> None:
    """Mark the state deleted (the caller checked it exists and is not gone). No commit."""
    _mark(session, model_id, name).deleted_at = utcnow()


def set_ttl(session: Session, model_id: str, name: str, ttl_seconds: int | None) -> None:
    """The state expires `ttl_seconds` from now, or never (None). The caller checked the state
    and the range (`MIN_TTL_S`..`MAX_TTL_S`). No commit."""
    row = _mark(session, model_id, name)
    row.expires_at = None if ttl_seconds is None else utcnow() + timedelta(seconds=ttl_seconds)


def publish(session: Session, model_id: str, name: str, public: bool) -> None:
    """Make the state readable by every project (`public`) or its own project's alone again.
    Idempotent: a state already so stays as it is (the official client retries a 409 for five
    minutes, and the retry of a call whose answer was lost must succeed). The caller checked
    the state exists. No commit."""
    if public:
        mark = _mark(session, model_id, name)
        mark.published_at = mark.published_at or utcnow()
    elif (row := session.get(StateMark, (model_id, name))) is not None:
        row.published_at = None  # a state never marked is private already: no row written
