"""Which queued job a free worker takes, and why a queued job waits.

A `workers.run_job` message is a token ("a job of pool P is runnable"), not an order: the worker
that receives it claims the best queued job of P, highest `priority` first, then the oldest (by
id). The decision is Postgres's, so priorities hold whatever order the broker delivers in
(kombu's filesystem transport keeps none). There is one message per queued job, so every queued
job is reached; the reconciler re-sends for jobs whose message was lost.

Postgres: `SELECT ... FOR UPDATE SKIP LOCKED` picks a candidate no other claimant is looking
at; the claim is still the fencing UPDATE of `core.jobs.claim` (queued -> starting), so exactly
one claimant wins each job. SQLite has no row locks: a plain ordered select, and a lost fencing
UPDATE moves on to the next candidate.

Devices: a worker runs several jobs at once (`workers.devices`) and claims only a job whose node
fits its free devices (`max_slots`: `Job.slots`, the job's `resources.procs_per_node`, at most
that). A job that does not fit keeps its place at the head of the queue, and the best job
behind it that fits runs meanwhile (backfill). Backfill alone would let a large job starve
behind a steady stream of small ones on a busy pool, so once the head of the queue has waited
longer than `reserve_after_s` (setting `TORCHYARD_RESERVE_AFTER_S`, default 600 s) a worker
that could ever fit it (`Reserve.largest_job`) stops claiming smaller jobs: its devices drain
until the head fits. A head no worker of the pool could ever fit reserves nothing on it.

A delivery that fits nothing claims nothing; the job its message stood for is still queued.
When an attempt ends and frees devices, and after a claim that leaves devices free, the
worker sends one message for its pool if a job is queued there (`head_of_queue`;
`workers.devices.wake`), so waiting jobs are reached at once (measured: 0.01-0.2 s from a
job's end to the next claim). A message that reached a full worker of a pool with several
workers is made up for only by the reconciler's re-send of jobs queued for longer than
`heartbeat_timeout_s` (every 20 s beat: 60-80 s by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from sqlalchemy import UnaryExpression, and_, func, or_, select
from sqlalchemy.orm import Session, aliased

from core import jobs
from core.models import Job, JobEvent, JobState, utcnow

MAX_CANDIDATES = 8  # SQLite: fencing UPDATEs lost to other claimants before giving up


def scheduling_order() -> tuple[UnaryExpression[Any], UnaryExpression[Any]]:
    """ORDER BY of a pool's queue: higher priority first, then older."""
    return (Job.priority.desc(), Job.id.asc())


@dataclass(frozen=True)
class Reserve:
    """When the head of the queue holds back smaller jobs on a claimant with too few free
    devices: it has been queued for at least `after_s` seconds (None: never) and needs at most
    `largest_job` devices (what the claimant's host could ever give; None: any number)."""

    after_s: float | None
    largest_job: int | None


def claim_next(
    *,
    session: Session,
    pool: str,
    worker: str,
    max_slots: int | None = None,
    reserve: Reserve | None = None,
) -> Job | None:
    """Claim the best queued job of `pool` for `worker` (queued -> starting, attempt + 1).

    `max_slots`: the most devices (`Job.slots`) the claimant has free; None for no limit.
    `reserve`: when a long-waiting head that does not fit keeps the devices for itself.
    Returns None when the pool has no queued job left for this claimant that fits, or the head
    reserves. Does not commit.
    """
    if (
        max_slots is not None
        and reserve is not None
        and _head_reserves(session, pool, max_slots, reserve)
    ):
        return None
    skipped: list[int] = []
    for _ in range(MAX_CANDIDATES):
        query = select(Job.id).where(Job.pool == pool, Job.state == JobState.QUEUED)
        if max_slots is not None:
            query = query.where(Job.slots <= max_slots)
        if skipped:
            query = query.where(Job.id.not_in(skipped))
        candidate = session.execute(
            query.order_by(*scheduling_order()).limit(1).with_for_update(skip_locked=True)
        ).scalar_one_or_none()
        if candidate is None:
            return None
        job = jobs.claim(session=session, job_id=candidate, worker=worker)
        if job is not None:
            return job
        skipped.append(candidate)  # another claimant won it (SQLite: no row lock held)
    return None


def _head_reserves(session: Session, pool: str, max_slots: int, reserve: Reserve) -> bool:
    if reserve.after_s is None:
        return False
    head = session.execute(
        select(Job.id, Job.slots)
        .where(Job.pool == pool, Job.state == JobState.QUEUED)
        .order_by(*scheduling_order())
        .limit(1)
    ).one_or_none()
    if head is None or head.slots <= max_slots:
        return False
    if reserve.largest_job is not None and head.slots > reserve.largest_job:
        return False
    queued_at = session.execute(
        select(JobEvent.created_at)
        .where(JobEvent.job_id == head.id, JobEvent.state_to == JobState.QUEUED)
        .order_by(JobEvent.id.desc())
        .limit(1)
    ).scalar_one_or_none()
    if queued_at is None:
        return False
    if queued_at.tzinfo is None:  # SQLite hands back naive UTC
        queued_at = queued_at.replace(tzinfo=UTC)
    return (utcnow() - queued_at).total_seconds() >= reserve.after_s


def head_of_queue(*, session: Session, pool: str) -> int | None:
    """The id of the queued job of `pool` a free worker with room takes first; None when none
    is queued."""
    query = select(Job.id).where(Job.pool == pool, Job.state == JobState.QUEUED)
    return session.execute(query.order_by(*scheduling_order()).limit(1)).scalar_one_or_none()


def queue_positions(*, session: Session, queued: Sequence[Job]) -> dict[int, int]:
    """{job id: 1-based place in its pool's queue} for the given queued jobs, in one query.

    Place 1 is the job the next free worker of the pool takes. Uses the index
    (pool, state, priority, id): one index range count per job.
    """
    ids = [j.id for j in queued if j.state == JobState.QUEUED]
    if not ids:
        return {}
    ahead = aliased(Job)
    count_ahead = (
        select(func.count())
        .select_from(ahead)
        .where(
            ahead.pool == Job.pool,
            ahead.state == JobState.QUEUED,
            or_(
                ahead.priority > Job.priority,
                and_(ahead.priority == Job.priority, ahead.id < Job.id),
            ),
        )
        .correlate(Job)
        .scalar_subquery()
    )
    rows = session.execute(select(Job.id, count_ahead).where(Job.id.in_(ids))).all()
    return {job_id: int(n) + 1 for job_id, n in rows}


def waiting_for(job: Job) -> str | None:
    """What a job that is not running waits for, in words; None when it waits for nothing."""
    if job.state == JobState.QUEUED:
        nodes = job.spec.resources.nodes
        if nodes > 1:
            return f"{nodes} free workers at once on pool {job.pool!r} (a gang of {nodes} nodes)"
        if job.slots > 1:
            return f"{job.slots} free devices on one worker of pool {job.pool!r}"
        return f"a free worker on pool {job.pool!r}"
    if job.state == JobState.PAUSED:
        return "a resume request (POST /v1/jobs/{id}/resume)".replace("{id}", str(job.id))
    if job.state == JobState.RESTARTING:
        return f"requeue after a failed attempt, then a free worker on pool {job.pool!r}"
    return None
