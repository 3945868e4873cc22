"""Dispatch after commit: the one way a queued job's run message leaves a transaction.

A job's row is the truth and its Celery message only a wake-up, so the message is sent after the
row is committed, never before (a worker would claim a job it cannot see yet) and never for a
transaction that rolled back. `add` records `(job_id, pool)` in the session (`Session.info`);
the session's `after_commit` hook hands each to the `Dispatch` the session was bound to (`bind`,
or `core.platform.db.session_factory(engine, dispatch)`: the API's `api.dispatch.Dispatcher.
send`, the controller's and workers' `workers.tasks.dispatch`), and a rollback drops them. A
session bound to nothing sends nothing: the reconciler's periodic re-dispatch of queued jobs
(`workers/reconcile.py`) is the floor under every path, a crash between commit and send too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from core.platform.db import DISPATCH_INFO_KEY

log = logging.getLogger(__name__)

Dispatch = Callable[[int, str], Any]
"""`(job_id, pool)`: send `workers.run_job(job_id)` to the pool's queue. May raise: the job
stays queued and the reconciler sends it again."""

_DISPATCH = DISPATCH_INFO_KEY  # keys of `Session.info`
_OUTBOX = "torchyard.dispatch_outbox"


def bind(session: Session, dispatch: Dispatch | None) -> Session:
    """Make `session` send what it queues through `dispatch` after each commit; returns it."""
    session.info[_DISPATCH] = dispatch
    return session


def add(session: Session, job_id: int, pool: str) -> None:
    """Send job `job_id`'s run message to `pool` once this session's transaction commits."""
    session.info.setdefault(_OUTBOX, []).append((job_id, pool))


def pending(session: Session) -> list[tuple[int, str]]:
    """What this session's transaction will send when it commits, in order."""
    return list(session.info.get(_OUTBOX, ()))


@event.listens_for(Session, "after_commit")
def _send(session: Session) -> None:
    # SQLAlchemy fires after_commit on a savepoint's release too (`begin_nested`), while the
    # outer transaction, and the job's row in it, is not yet committed: a worker reading the
    # row at once would find it gone and drop the message. Only the root's commit sends.
    if session.in_nested_transaction():
        return
    queued: list[tuple[int, str]] = session.info.pop(_OUTBOX, [])
    dispatch = session.info.get(_DISPATCH)
    if dispatch is None:
        return
    for job_id, pool in queued:
        try:
            dispatch(job_id, pool)
        except Exception:  # the row is committed: the reconciler sends it again
            log.exception("job %s: dispatch to %r failed; the reconciler will retry", job_id, pool)


@event.listens_for(Session, "after_soft_rollback")
def _drop(session: Session, previous_transaction: SessionTransaction) -> None:
    if not previous_transaction.nested:  # a savepoint's rollback keeps the outer work
        session.info.pop(_OUTBOX, None)
