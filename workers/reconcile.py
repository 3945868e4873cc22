"""The reconciler: Postgres is the truth, the broker only a hint.

- A job `queued` for longer than `redispatch_after_s` may have lost its message (broker
  restart, a send that failed after the commit): send `workers.run_job` again. A duplicate is
  harmless, the claim fences it.
- A job in starting/running/cancelling whose heartbeat is older than
  `settings.heartbeat_timeout_s` lost its worker: cancelling -> cancelled, otherwise requeued
  (restarting -> queued) while `retries.max_restarts` allows, else failed. A multi-node
  job is reaped as a whole when any of its nodes went silent (its own slot heartbeat), even if
  the other nodes still heartbeat the job row.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from core import gang, jobs
from core.jobs import ACTIVE_STATES
from core.models import Job, JobState, utcnow
from core.settings import Settings
from workers.outcome import Cause, ExitCause, requeue, restarts_left

log = logging.getLogger(__name__)

Dispatch = Callable[[int, str], None]


@dataclass
class Report:
    redispatched: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    paused: list[int] = field(default_factory=list)


def reconcile(
    *,
    settings: Settings,
    session_factory: Callable[[], Session],
    dispatch: Dispatch,
    redispatch_after_s: float,
    pools: Sequence[str] | None = None,
    now: datetime | None = None,
) -> Report:
    """Reap jobs of dead workers, then re-send stale queued jobs. Only `pools` when given."""
    now = now or utcnow()
    report = Report()
    for job_id in _stale_active(session_factory, settings, now, pools):
        pool = _reap(session_factory, settings, job_id, now, report)
        if pool is not None:
            _send(dispatch, job_id, pool)
    cutoff = now - timedelta(seconds=redispatch_after_s)
    with session_factory() as session:
        query = select(Job.id, Job.pool, Job.updated_at).where(
            Job.state == JobState.QUEUED, Job.updated_at <= cutoff
        )
        if pools is not None:
            query = query.where(Job.pool.in_(list(pools)))
        stale = session.execute(query.order_by(Job.priority.desc(), Job.id)).all()
        for job_id, pool, seen in stale:
            # Compare-and-set on updated_at: one reconciler re-sends a job once per period.
            bumped = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.state == JobState.QUEUED, Job.updated_at == seen)
                .values(updated_at=now)
                .execution_options(synchronize_session=False)
            )
            session.commit()
            if bumped.rowcount == 1:  # type: ignore[attr-defined]
                _send(dispatch, job_id, pool)
                report.redispatched.append(job_id)
    if any(dataclasses.astuple(report)):
        log.info("reconcile: %s", report)
    return report


def _stale_active(
    factory: Callable[[], Session], settings: Settings, now: datetime, pools: Sequence[str] | None
) -> list[int]:
    cutoff = now - timedelta(seconds=settings.heartbeat_timeout_s)
    query = select(Job.id).where(
        Job.state.in_(ACTIVE_STATES),
        or_(
            Job.heartbeat_at < cutoff,
            and_(Job.heartbeat_at.is_(None), Job.updated_at < cutoff),
        ),
    )
    if pools is not None:
        query = query.where(Job.pool.in_(list(pools)))
    with factory() as session:
        found = set(session.execute(query).scalars())
        for job_id, _ in gang.stale_nodes(session=session, cutoff=cutoff):
            found.add(job_id)
        if pools is not None and found:
            rows = select(Job.id).where(Job.id.in_(found), Job.pool.in_(list(pools)))
            found = set(session.execute(rows).scalars())
    return sorted(found)


def _reap(
    factory: Callable[[], Session], settings: Settings, job_id: int, now: datetime, report: Report
) -> str | None:
    """End or requeue one job whose worker is gone; returns the queue to dispatch to, if any."""
    with factory() as session:
        # Row lock: a worker's heartbeat waits, then finds the job no longer its own.
        job = session.execute(
            select(Job)
            .where(Job.id == job_id)
            .with_for_update(skip_locked=True)
            .execution_options(populate_existing=True)
        ).scalar_one_or_none()
        if job is None or job.state not in ACTIVE_STATES:
            return None
        last_seen = _aware(job.heartbeat_at or job.updated_at)
        node_seen = gang.oldest_heartbeat(session=session, job=job)
        if node_seen is not None:  # a gang is as alive as its most silent node
            last_seen = min(last_seen, _aware(node_seen))
        silence = (now - last_seen).total_seconds()
        if silence <= settings.heartbeat_timeout_s:
            return None
        reason = f"worker lost (no heartbeat for {int(silence)} s)"
        log.warning("job %s (%s, worker %s): %s", job_id, job.state, job.worker, reason)
        pool = None
        # The attempt ran until its last heartbeat, as far as anyone can tell.
        ran = {"runtime_s": Job.runtime_s + _seconds_between(job.started_at, last_seen)}
        if job.state == JobState.CANCELLING:
            jobs.transition(session=session, job_id=job_id, to=JobState.CANCELLED, message=reason)
            report.cancelled.append(job_id)
        elif job.state == JobState.PAUSING:  # resume continues from the latest checkpoint
            jobs.transition(session=session, job_id=job_id, to=JobState.PAUSED, message=reason)
            report.paused.append(job_id)
        elif restarts_left(session, job) > 0:
            requeue(
                session=session,
                job_id=job_id,
                cause=Cause.FAILURE,
                message=f"{reason}; restarting from the latest checkpoint",
                data={
                    "attempt": job.attempt,
                    "worker": job.worker,
                    "exit_cause": str(ExitCause.WORKER_LOST),
                },
                values={"error": reason, **ran},
            )
            report.requeued.append(job_id)
            pool = job.pool
        else:
            jobs.transition(
                session=session,
                job_id=job_id,
                to=JobState.FAILED,
                message=reason,
                values={"error": reason, **ran},
            )
            report.failed.append(job_id)
        session.commit()
        return pool


def _aware(when: datetime) -> datetime:
    """SQLite hands back naive UTC."""
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _seconds_between(start: datetime | None, end: datetime) -> float:
    if start is None:
        return 0.0
    if start.tzinfo is None:  # SQLite hands back naive UTC
        start = start.replace(tzinfo=UTC)
    return max(0.0, (end - start).total_seconds())


def _send(dispatch: Dispatch, job_id: int, pool: str) -> None:
    try:
        dispatch(job_id, pool)
    except Exception:  # still queued in the DB: the next reconcile sends it again
        log.exception("job %s: dispatch to %r failed", job_id, pool)
