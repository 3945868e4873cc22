"""Priority preemption on a pool: read the facts, let `core.scheduling.preemption_policy.choose`
decide, apply.

Enabled per pool by `TORCHYARD_PREEMPTION_POOLS` (`*`: every pool; default none). The
reconciler (`workers.reconcile`, every 2 s) calls `preempt_pool` for each enabled pool with a
queued job of higher priority than one of its running jobs. A victim goes `running ->
preempting` (event data `for_job`, `for_priority`): its workers stop the trainer as for a
pause (SIGTERM; the trainer checkpoints and stops), and when the attempt ends
(`core.attempts.lifecycle_policy`: `Outcome.PREEMPTED`, whatever the exit) `requeue` puts it back in
the queue (`preempting -> queued`) with a `preempted` event naming the job it yielded to and the
step of its latest checkpoint. No restart is counted; it keeps its priority and its place by age
(id), and its next attempt resumes from that checkpoint, so it loses no step before it. Its devices
are freed when the attempt ends, and the freeing worker wakes the pool: the job it yielded to is the
head of the queue then.

The victims' devices are per worker: `free` counts each live worker's devices less those every
active job of any pool holds there (its current attempt's nodes), so a victim is only chosen
where its devices make the waiting job fit (`core.scheduling.preemption_policy`). A queued job that
only its project's slot or running-jobs limit keeps out (`quota gpus 2/2`, `quota running jobs 3/3`)
is a candidate too: its own project's jobs of lower priority yield to it, no other project's.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.errors import Conflict
from core.platform.settings import Settings
from core.platform.tables import Job, JobEvent, JobNode, JobState, Worker, aware, utcnow
from core.scheduling import quotas
from core.scheduling.preemption_policy import Holder, Waiting, choose

log = logging.getLogger(__name__)

ALL = "*"
MAX_WAITING = 50  # queued jobs of a pool one pass looks at, in claim order
LEAVING = (JobState.CANCELLING, JobState.PAUSING, JobState.PREEMPTING)


def enabled(settings: Settings, pool: str) -> bool:
    """Whether preemption is on for `pool` (`TORCHYARD_PREEMPTION_POOLS`)."""
    return ALL in settings.preemption_pools or pool in settings.preemption_pools


def candidate_pools(*, session: Session, settings: Settings) -> list[str]:
    """The enabled pools where a queued job outranks a running one: one grouped query."""
    if not settings.preemption_pools:
        return []
    queued = (
        select(Job.pool, func.max(Job.priority).label("top"))
        .where(Job.state == JobState.QUEUED)
        .group_by(Job.pool)
        .subquery()
    )
    running = (
        select(Job.pool, func.min(Job.priority).label("low"))
        .where(Job.state == JobState.RUNNING)
        .group_by(Job.pool)
        .subquery()
    )
    rows = session.execute(
        select(queued.c.pool)
        .join(running, running.c.pool == queued.c.pool)
        .where(queued.c.top > running.c.low)
    ).scalars()
    return sorted(p for p in rows if enabled(settings, p))


def _nodes(session: Session) -> dict[int, list[str]]:
    """{active job id: the workers of its current attempt's live nodes}."""
    out: dict[int, list[str]] = {}
    for job_id, worker in session.execute(
        select(JobNode.job_id, JobNode.worker)
        .join(Job, (Job.id == JobNode.job_id) & (Job.attempt == JobNode.attempt))
        .where(Job.state.in_(quotas.HOLDING), JobNode.worker.is_not(None))
        .where(JobNode.ended_at.is_(None))
        .order_by(JobNode.job_id, JobNode.node_rank)
    ):
        out.setdefault(job_id, []).append(str(worker))
    return out


def _free(session: Session, pool: str, settings: Settings, now: datetime) -> dict[str, int]:
    """{live worker of `pool`: devices no active job holds there}."""
    cutoff = now - timedelta(seconds=settings.worker_timeout_s)
    totals = {
        name: int(total)
        for name, pools, total, beat in session.execute(
            select(Worker.name, Worker.pool, Worker.slots_total, Worker.heartbeat_at).where(
                Worker.stopping.is_(False)
            )
        )
        if pool in pools.split(",") and aware(beat) >= cutoff
    }
    nodes = _nodes(session)
    rows = session.execute(
        select(Job.id, Job.worker, Job.slots).where(Job.state.in_(quotas.HOLDING))
    ).all()
    held: dict[str, int] = {}
    for job_id, worker, slots in rows:
        for name in nodes.get(job_id) or ([worker] if worker else []):
            if name in totals:  # a CPU job larger than its host takes the host
                held[name] = min(totals[name], held.get(name, 0) + min(slots, totals[name]))
    return {name: max(0, total - held.get(name, 0)) for name, total in totals.items()}


def _holders(session: Session, pool: str, now: datetime) -> list[Holder]:
    nodes = _nodes(session)
    rows = session.execute(
        select(
            Job.id, Job.project_id, Job.priority, Job.slots, Job.worker, Job.started_at, Job.state
        ).where(Job.pool == pool, Job.state.in_(quotas.HOLDING))
    ).all()
    out = []
    for job_id, project_id, priority, slots, worker, started_at, state in rows:
        workers = nodes.get(job_id) or ([worker] if worker else [])
        ran = 0.0 if started_at is None else (now - aware(started_at)).total_seconds()
        out.append(
            Holder(
                id=job_id,
                project_id=project_id,
                priority=priority,
                slots=slots,
                workers=tuple(workers),
                ran_s=ran,
                running=state == JobState.RUNNING,
                leaving=state in LEAVING,
            )
        )
    return out


def _waiting(
    session: Session, pool: str, holders: list[Holder]
) -> tuple[list[Waiting], dict[str, float], dict[str, int], dict[str, int]]:
    """The pool's queued jobs within their quotas (but for the slot and running-jobs limits,
    under which preemption within a project makes room) in claim order, the projects' weights,
    and the room under their slot and running-jobs limits (projects that have one)."""
    rows = session.execute(
        select(Job.id, Job.project_id, Job.priority, Job.slots, quotas.job_size()).where(
            Job.pool == pool, Job.state == JobState.QUEUED
        )
    ).all()
    projects = sorted({r.project_id for r in rows} | {h.project_id for h in holders})
    standings = quotas.standings(session=session, pool=pool, project_ids=projects)
    queued = [
        Waiting(id=i, project_id=p, priority=prio, slots=slots, nodes=max(1, size // max(1, slots)))
        for i, p, prio, slots, size in rows
        if standings[p].blocked(size, held=False) is None
    ]
    queued.sort(key=lambda w: (standings[w.project_id].share, -w.priority, w.id))
    rooms = {p: room for p, s in standings.items() if (room := s.room()) is not None}
    jobs_rooms = {p: room for p, s in standings.items() if (room := s.jobs_room()) is not None}
    weights = {p: s.weight for p, s in standings.items()}
    return queued[:MAX_WAITING], weights, rooms, jobs_rooms


def preempt_pool(
    *, session: Session, pool: str, settings: Settings, now: datetime | None = None
) -> dict[int, int]:
    """Move the running jobs `core.scheduling.preemption_policy.choose` picks on `pool` to
    `preempting`; returns {victim job id: the queued job id it yields to}. A victim whose state
    moved meanwhile is left alone. Does not commit."""
    now = now or utcnow()
    holders = _holders(session, pool, now)
    waiting, weights, quota_room, jobs_room = _waiting(session, pool, holders)
    choice = choose(
        waiting=waiting,
        holders=holders,
        free=_free(session, pool, settings, now),
        weights=weights,
        min_run_s=settings.preemption_min_run_s,
        quota_room=quota_room,
        jobs_room=jobs_room,
    )
    priority = {w.id: w.priority for w in waiting}
    done: dict[int, int] = {}
    for victim, for_job in sorted(choice.victims.items()):
        try:
            jobs.transition(
                session=session,
                job_id=victim,
                to=JobState.PREEMPTING,
                from_states=[JobState.RUNNING],
                message=f"preempted for job {for_job} (priority {priority[for_job]}): "
                "checkpointing, then back to the queue",
                data={"for_job": for_job, "for_priority": priority[for_job]},
            )
        except Conflict:
            continue
        log.info("pool %r: job %s preempted for job %s", pool, victim, for_job)
        done[victim] = for_job
    return done


def _preempting_event(session: Session, job: Job, attempt: int) -> dict[str, Any]:
    data = session.execute(
        select(JobEvent.data)
        .where(
            JobEvent.job_id == job.id,
            JobEvent.attempt == attempt,
            JobEvent.state_to == JobState.PREEMPTING,
        )
        .order_by(JobEvent.id.desc())
        .limit(1)
    ).scalar_one_or_none()
    return dict(data or {})


def _checkpoint_step(session: Session, job_id: int) -> int | None:
    data = session.execute(
        select(JobEvent.data)
        .where(JobEvent.job_id == job_id, JobEvent.kind == "checkpoint")
        .order_by(JobEvent.id.desc())
        .limit(1)
    ).scalar_one_or_none()
    return None if not data else data.get("step")


def requeue(
    *, session: Session, job: Job, attempt: int, values: dict[str, Any] | None = None
) -> Job:
    """preempting -> queued with a `preempted` event (the job it yielded to, the step of the
    latest checkpoint, which the next attempt resumes from). No restart is counted. Raises
    Conflict when the job is no longer preempting. Does not commit or dispatch."""
    why = _preempting_event(session, job, attempt)
    for_job, step = why.get("for_job"), _checkpoint_step(session, job.id)
    data = {"cause": "preempted", "attempt": attempt, "for_job": for_job}
    queued = jobs.transition(
        session=session,
        job_id=job.id,
        to=JobState.QUEUED,
        from_states=[JobState.PREEMPTING],
        message=f"requeued (preempted for job {for_job})",
        data=data,
        values=values,
    )
    resumes = "from the start" if step is None else f"from its checkpoint at step {step}"
    jobs.add_event(
        session=session,
        job=queued,
        kind="preempted",
        message=f"yielded to job {for_job} (priority {why.get('for_priority')}); resumes {resumes}",
        data={**why, "attempt": attempt, "checkpoint_step": step},
        attempt=attempt,
    )
    return queued


def yielding(*, session: Session, pool: str) -> dict[int, list[int]]:
    """{queued job id: the jobs of `pool` preempting for it now}: the queue's `preempting job
    N` reason."""
    rows = session.execute(
        select(Job.id, JobEvent.data)
        .join(JobEvent, (JobEvent.job_id == Job.id) & (JobEvent.attempt == Job.attempt))
        .where(
            Job.pool == pool,
            Job.state == JobState.PREEMPTING,
            JobEvent.state_to == JobState.PREEMPTING,
        )
        .order_by(Job.id)
    ).all()
    out: dict[int, list[int]] = {}
    for victim, data in rows:
        for_job = (data or {}).get("for_job")
        if isinstance(for_job, int) and victim not in out.get(for_job, []):
            out.setdefault(for_job, []).append(victim)
    return out
