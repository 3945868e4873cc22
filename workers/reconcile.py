"""The reconciler: Postgres is the truth, the broker only a hint.

- Lost attempts. A job in starting/running/cancelling/pausing, or a live node of a gang's
  current attempt, is lost when
  * its worker restarted: the worker's row (`workers`, `workers.liveness`) has a later
    `started_at` than the job's claim (`jobs.started_at`) or the node's `joined_at`; the
    trainers died with the old process (`processes.spawn` sets the parent-death signal);
  * its worker is silent: the row is older than `worker_timeout_s` (10 s);
  * or its own heartbeat (the supervise loop's, `jobs.heartbeat_at` / the node's) is older
    than `heartbeat_timeout_s` (60 s): a wedged loop in a live worker, or a worker without a
    row.
  What that means is `core.attempts.lifecycle_policy.decide`'s answer to a `node_lost` failure
  (requeue while the budget lasts, else failed; cancelling -> cancelled, pausing -> paused), applied
  by `core.attempts.lifecycle_apply.apply` in the transaction that holds the job's row lock and
  re-checked the loss. No policy here.
- Priority preemption (`core.scheduling.preemption_apply`) on the pools `TORCHYARD_PREEMPTION_POOLS`
  enables: running jobs of lower priority yield to a queued job that does not fit.
- Training sessions (`/tinker`) whose client is silent past `session_idle_timeout_s` end
  (`core.sessions.service.end_idle`), on a reconcile of every pool.
- A job `queued` for longer than `redispatch_after_s` may have lost its message (broker
  restart, a send that failed after the commit): send `workers.run_job` again. A duplicate is
  harmless, the claim fences it.

Silence is judged only by a reconciler that has been in touch with the database itself for
the whole `worker_timeout_s` (`steady_s`): after a database outage every row is old, and no
worker is gone for that. A restart needs no such care.

Times compare values written by different hosts' clocks (the worker's beats, the reconciler's
now): keep them in sync (NTP); a skew of a few seconds shortens or lengthens the timeouts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    and_,
    exists,
    false,
    literal,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.orm import Session, aliased

from core.attempts.lifecycle_apply import apply, facts_for
from core.attempts.lifecycle_policy import Failure, FailureClass, Outcome, decide
from core.jobs.service import ACTIVE_STATES
from core.platform.settings import Settings
from core.platform.tables import Job, JobNode, JobState, Worker, aware, utcnow
from core.scheduling import preemption_apply as preempt
from core.sessions import service as sessions

log = logging.getLogger(__name__)

Dispatch = Callable[[int, str], None]


@dataclass
class Report:
    redispatched: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    paused: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    sessions_ended: list[str] = field(default_factory=list)  # idle training sessions


_REPORTED = {
    Outcome.RESTART: "requeued",
    Outcome.HAND_BACK: "requeued",
    Outcome.PREEMPTED: "requeued",
    Outcome.FAILED: "failed",
    Outcome.CANCELLED: "cancelled",
    Outcome.PAUSED: "paused",
}


@dataclass(frozen=True)
class Scope:
    """Which attempts one reconcile looks at, and by which clock.

    `now`: the reconciler's time; `silence`: judge silent workers and heartbeats (False: only
    restarts); `pools`, `worker`: only jobs of those pools / attempts (nodes) of that worker.
    """

    now: datetime
    silence: bool = True
    pools: Sequence[str] | None = None
    worker: str | None = None


def reconcile_deployed(
    *,
    settings: Settings,
    session_factory: Callable[[], Session],
    dispatch: Dispatch,
    steady_s: float,
) -> Report:
    """`reconcile` as a deployment runs it (the controller, or a worker's `workers.reconcile`
    task): every pool, stale queued jobs re-sent after `heartbeat_timeout_s`."""
    return reconcile(
        settings=settings,
        session_factory=session_factory,
        dispatch=dispatch,
        redispatch_after_s=settings.heartbeat_timeout_s,
        steady_s=steady_s,
    )


def reconcile(
    *,
    settings: Settings,
    session_factory: Callable[[], Session],
    dispatch: Dispatch,
    redispatch_after_s: float,
    pools: Sequence[str] | None = None,
    now: datetime | None = None,
    steady_s: float | None = None,
) -> Report:
    """End or requeue lost attempts, then re-send stale queued jobs. Only `pools` when given.

    `steady_s`: seconds this process's own worker heartbeat has gone through without a gap
    (`WorkerHeartbeat.steady_s`); silence is judged only from `worker_timeout_s` on. None: no
    such process (a direct call), judge it.
    """
    now = now or utcnow()
    silence = steady_s is None or steady_s >= settings.worker_timeout_s
    report = reap(
        settings=settings,
        session_factory=session_factory,
        dispatch=dispatch,
        scope=Scope(now=now, silence=silence, pools=pools),
    )
    report.preempted = preempt_pools(
        settings=settings, session_factory=session_factory, pools=pools
    )
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
    if pools is None:
        report.sessions_ended = end_idle_sessions(
            settings=settings, session_factory=session_factory, now=now
        )
    if any(dataclasses.astuple(report)):
        log.info("reconcile: %s", report)
    return report


def end_idle_sessions(
    *, settings: Settings, session_factory: Callable[[], Session], now: datetime
) -> list[str]:
    """End the training sessions (`/tinker`) whose client sent no heartbeat for
    `session_idle_timeout_s` (`core.sessions.service.end_idle`); their ids."""
    with session_factory() as session:
        ended = sessions.end_idle(
            session=session, idle_timeout_s=settings.session_idle_timeout_s, now=now
        )
        session.commit()
    return ended


def preempt_pools(
    *,
    settings: Settings,
    session_factory: Callable[[], Session],
    pools: Sequence[str] | None = None,
) -> list[int]:
    """Preempt for higher-priority queued jobs on every enabled pool (only `pools` when given)
    where one outranks a running job; the jobs moved to `preempting`. One transaction per pool;
    a pool that fails is logged and tried again next period."""
    with session_factory() as session:
        found = preempt.candidate_pools(session=session, settings=settings)
    victims: list[int] = []
    for pool in found:
        if pools is not None and pool not in pools:
            continue
        try:
            with session_factory() as session:
                victims += preempt.preempt_pool(session=session, pool=pool, settings=settings)
                session.commit()
        except Exception:
            log.exception("pool %r: preemption failed; tried again next period", pool)
    return sorted(victims)


def reap(
    *,
    settings: Settings,
    session_factory: Callable[[], Session],
    dispatch: Dispatch,
    scope: Scope,
) -> Report:
    """Apply the lifecycle's answer to every lost attempt in `scope`; dispatch the requeued."""
    report = Report()
    with session_factory() as session:
        lost = sorted({row.job_id for row in session.execute(_lost(settings, scope))})
    for job_id in lost:
        try:
            reaped = _reap(session_factory, settings, scope, job_id)
        except Exception:  # one job that cannot be applied (a spec that no longer validates)
            log.exception("job %s: lost, but its end could not be recorded", job_id)
            continue  # must not keep the others from being reaped; tried again next period
        if reaped is None:
            continue
        outcome, pool = reaped
        getattr(report, _REPORTED[outcome]).append(job_id)
        if pool is not None:
            _send(dispatch, job_id, pool)
    return report


def _lost(settings: Settings, scope: Scope, job_id: int | None = None) -> Select[Any]:
    """The lost attempts in `scope` (of job `job_id` only, when given): one row per lost job
    (node 0, by its job row) or gang node, with the flags that say how it was lost.

    Two cheap selects: the active jobs (index on state) and their live nodes, each joined to
    its worker's row by name.
    """
    row = aliased(Worker)
    worker_cut = scope.now - timedelta(seconds=settings.worker_timeout_s)
    beat_cut = scope.now - timedelta(seconds=settings.heartbeat_timeout_s)

    def flags(since: Any, seen: Any, updated: Any) -> list[ColumnElement[bool]]:
        restarted = row.started_at > since
        if not scope.silence:
            return [restarted, false(), false()]
        worker_silent = row.heartbeat_at < worker_cut
        beat_silent = or_(seen < beat_cut, and_(seen.is_(None), updated < beat_cut))
        return [restarted, worker_silent, beat_silent]

    def lost_select(
        job_id_col: Any, node_rank: Any, name: Any, host: Any, since: Any, seen: Any, updated: Any
    ) -> Select[Any]:
        restarted, worker_silent, beat_silent = flags(since, seen, updated)
        query = select(
            job_id_col.label("job_id"),
            node_rank.label("node_rank"),
            name.label("worker"),
            host.label("host"),
            seen.label("seen"),
            row.heartbeat_at.label("worker_seen"),
            row.started_at.label("incarnation"),
            restarted.label("restarted"),
            worker_silent.label("worker_silent"),
            beat_silent.label("beat_silent"),
        ).where(Job.state.in_(ACTIVE_STATES), or_(restarted, worker_silent, beat_silent))
        if scope.pools is not None:
            query = query.where(Job.pool.in_(list(scope.pools)))
        if scope.worker is not None:
            query = query.where(name == scope.worker)
        if job_id is not None:
            query = query.where(Job.id == job_id)
        return query

    by_job = (
        lost_select(
            Job.id,
            literal(0, Integer),
            Job.worker,
            row.host,
            Job.started_at,
            Job.heartbeat_at,
            Job.updated_at,
        )
        .select_from(Job)
        .outerjoin(row, row.name == Job.worker)
        # The claimant is node 0: once its node ended, the other nodes answer for the attempt.
        .where(~exists().where(*_node(0), JobNode.ended_at.is_not(None)))
    )
    by_node = (
        lost_select(
            JobNode.job_id,
            JobNode.node_rank,
            JobNode.worker,
            JobNode.host,
            JobNode.joined_at,
            JobNode.heartbeat_at,
            JobNode.joined_at,
        )
        .select_from(JobNode)
        .join(Job, and_(*_node()))
        .outerjoin(row, row.name == JobNode.worker)
        .where(JobNode.worker.is_not(None), JobNode.ended_at.is_(None))
    )
    return union_all(by_job, by_node).subquery().select()


def _node(node_rank: int | None = None) -> list[ColumnElement[bool]]:
    """A node row of the job's current attempt (node `node_rank` when given)."""
    match = [JobNode.job_id == Job.id, JobNode.attempt == Job.attempt]
    return match if node_rank is None else [*match, JobNode.node_rank == node_rank]


def _failure(found: Any, now: datetime) -> Failure:
    """The `node_lost` failure of one row of `_lost`: the most telling of its flags."""
    who = f"worker {found.worker or '?'}"
    if found.restarted:
        reason = f"{who} restarted at {aware(found.incarnation):%H:%M:%S} UTC; its trainers died"
    elif found.worker_silent:
        silence = (now - aware(found.worker_seen)).total_seconds()
        reason = f"{who} gone: no worker heartbeat for {int(silence)} s"
    else:
        seen = found.seen if found.seen is not None else now
        silence = (now - aware(seen)).total_seconds()
        reason = f"{who}: no heartbeat of the attempt for {int(silence)} s"
    return Failure(
        FailureClass.NODE_LOST, reason, node_rank=found.node_rank, host=found.host or None
    )


def _reap(
    factory: Callable[[], Session], settings: Settings, scope: Scope, job_id: int
) -> tuple[Outcome, str | None] | None:
    """Apply the lifecycle to one lost job if it still is; (outcome, pool to dispatch to)."""
    with factory() as session:
        # Row lock: a worker's heartbeat waits, then finds the job no longer its own. A row
        # locked right now (its worker is writing: alive) is left to the next period.
        job = session.execute(
            select(Job)
            .where(Job.id == job_id)
            .with_for_update(skip_locked=True)
            .execution_options(populate_existing=True)
        ).scalar_one_or_none()
        if job is None or job.state not in ACTIVE_STATES:
            return None
        # Re-check under the lock: the worker may have beaten or ended the attempt meanwhile.
        found = session.execute(_lost(settings, scope, job_id)).first()
        if found is None:
            return None
        failure = _failure(found, scope.now)
        decision = decide(facts_for(job, lost=failure))
        log.warning(
            "job %s (%s, attempt %s): %s -> %s",
            job_id,
            job.state,
            job.attempt,
            failure.reason,
            decision.outcome,
        )
        # The attempt ran until its last heartbeat, as far as anyone can tell.
        last_seen = job.heartbeat_at or job.updated_at
        pool = apply(
            session=session,
            job=job,
            decision=decision,
            runtime_s=_seconds_between(job.started_at, aware(last_seen)),
        )
        session.commit()
        return decision.outcome, pool


def _seconds_between(start: datetime | None, end: datetime) -> float:
    if start is None:
        return 0.0
    return max(0.0, (end - aware(start)).total_seconds())


def _send(dispatch: Dispatch, job_id: int, pool: str) -> None:
    try:
        dispatch(job_id, pool)
    except Exception:  # still queued in the DB: the next reconcile sends it again
        log.exception("job %s: dispatch to %r failed", job_id, pool)
