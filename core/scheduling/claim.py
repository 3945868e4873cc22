"""Which queued job a free worker takes, and why a queued job waits.

A `workers.run_job` message is a token ("a job of pool P is runnable"), not an order: the worker
that receives it claims the best queued job of P. Best: of the projects within their quotas
(`core.scheduling.quotas`: slots, running jobs, monthly slot-hours), the one with the fewest active
slots on P per fair-share weight, then the highest `priority`, then the oldest (by id). The decision
is Postgres's, so quotas, fair share and priorities hold whatever order the broker delivers in
(kombu's filesystem transport keeps none). `core.scheduling.queue_forecast` replays the same order
to tell a waiting job its place, reason and estimated start. There is one message per queued job, so
every queued job is reached; the reconciler re-sends for jobs whose message was lost.

Postgres: `SELECT ... FOR UPDATE SKIP LOCKED` picks a candidate no other claimant is looking
at; the claim is still the fencing UPDATE of `core.jobs.service.claim` (queued -> starting), so
exactly one claimant wins each job. SQLite has no row locks: a plain ordered select, and a lost
fencing UPDATE moves on to the next candidate.

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
from functools import lru_cache
from typing import Any

from sqlalchemy import Select, UnaryExpression, and_, bindparam, case, func, or_, select, update
from sqlalchemy.orm import Session, aliased

from core.jobs import service as jobs
from core.platform.tables import Job, JobEvent, JobState, utcnow
from core.scheduling import quotas

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

    Best: of the projects within their quotas (`core.scheduling.quotas`), the one with the fewest
    active slots per weight on the pool, then the highest priority, then the oldest. `max_slots`:
    the most devices (`Job.slots`) the claimant has free; None for no limit. `reserve`: when a
    long-waiting head that does not fit keeps the devices for itself. A limited project's quota rows
    are locked (`FOR UPDATE`) and its standing re-read before its job is claimed, so concurrent
    claimants never overrun a quota. Queued jobs of projects over a quota get the reason on
    `wait_reason`. Returns None when the pool has no queued job left for this claimant that fits, or
    the head reserves. Does not commit.
    """
    projects = list(
        session.execute(
            select(Job.project_id).where(Job.pool == pool, Job.state == JobState.QUEUED).distinct()
        ).scalars()
    )
    if not projects:
        return None
    standings = quotas.standings(session=session, pool=pool, project_ids=projects)
    if (
        max_slots is not None
        and reserve is not None
        and _head_reserves(session, _queue(standings, pool), max_slots, reserve)
    ):
        _note_waits(session, pool, standings)
        return None
    skipped: list[int] = []
    for _ in range(MAX_CANDIDATES):
        query = _queue(standings, pool)
        if max_slots is not None:
            query = query.where(Job.slots <= max_slots)
        if skipped:
            query = query.where(Job.id.not_in(skipped))
        row = session.execute(query.limit(1).with_for_update(skip_locked=True)).one_or_none()
        if row is None:
            break
        if standings[row.project_id].rows:  # limited: serialise its claims, then re-check
            standings[row.project_id] = quotas.standings(
                session=session, pool=pool, project_ids=[row.project_id], lock=True
            )[row.project_id]
            if standings[row.project_id].blocked(row.size) is not None:
                continue  # the refreshed standings leave it out
        job = jobs.claim(session=session, job_id=row.id, worker=worker)
        if job is not None:
            job.wait_reason = None
            standings[row.project_id].start(row.size)
            _note_waits(session, pool, standings)
            return job
        skipped.append(row.id)  # another claimant won it (SQLite: no row lock held)
    _note_waits(session, pool, standings)
    return None


def claim_order(standings: dict[str, quotas.Standing]) -> list[Any]:
    """ORDER BY of a pool's claimable jobs: fewest active slots per weight of their project,
    then priority, then age."""
    shares = {p: s.share for p, s in standings.items()}
    if len(set(shares.values())) <= 1:
        return list(scheduling_order())
    return [case(shares, value=Job.project_id, else_=0.0).asc(), *scheduling_order()]


def _queue(standings: dict[str, quotas.Standing], pool: str) -> Select[int, str, int, int]:
    """The pool's claimable queued jobs (id, project_id, slots, size) in claim order: none of
    a project over a quota, none larger than its project's room."""
    size = quotas.job_size().label("size")
    query = select(Job.id, Job.project_id, Job.slots, size).where(
        Job.pool == pool, Job.state == JobState.QUEUED
    )
    blocked = [p for p, s in standings.items() if s.blocked() is not None]
    if blocked:
        query = query.where(Job.project_id.not_in(blocked))
    rooms = {p: s.room() for p, s in standings.items() if p not in blocked}
    limited = {p: r for p, r in rooms.items() if r is not None}
    if limited:
        query = query.where(
            or_(
                Job.project_id.not_in(list(limited)),
                *(and_(Job.project_id == p, quotas.job_size() <= r) for p, r in limited.items()),
            )
        )
    return query.order_by(*claim_order(standings))


def _note_waits(session: Session, pool: str, standings: dict[str, quotas.Standing]) -> None:
    """Write why the queued jobs of projects over a quota wait (`wait_reason`), skipping rows
    other claimants hold, and only where the reason changed."""
    for project_id, standing in standings.items():
        reason = standing.blocked()
        where = [Job.pool == pool, Job.state == JobState.QUEUED, Job.project_id == project_id]
        if reason is None:
            room = standing.room()
            if room is None:
                continue
            reason = standing.blocked(room + 1)
            where.append(quotas.job_size() > room)
        assert reason is not None
        where.append(or_(Job.wait_reason.is_(None), Job.wait_reason != reason))
        ids = select(Job.id).where(*where).with_for_update(skip_locked=True)
        session.execute(
            update(Job)
            .where(Job.id.in_(ids.scalar_subquery()))
            .values(wait_reason=reason)
            .execution_options(synchronize_session=False)
        )


def _head_reserves(
    session: Session, queue: Select[int, str, int, int], max_slots: int, reserve: Reserve
) -> bool:
    if reserve.after_s is None:
        return False
    head = session.execute(queue.limit(1)).one_or_none()
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


@lru_cache(maxsize=1)
def _places_statement() -> Select[Any]:
    """`SELECT id, count of jobs ahead` for the job ids bound to `ids` (an expanding parameter).

    Built once: an `aliased` correlated subquery costs about a millisecond of CPU to construct,
    more than Postgres takes to run it, and the submit path runs it per request."""
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
    return select(Job.id, count_ahead).where(Job.id.in_(bindparam("ids", expanding=True)))


def queue_positions(*, session: Session, queued: Sequence[Job]) -> dict[int, int]:
    """{job id: 1-based place in its pool's queue} for the given queued jobs, in one query.

    Place 1 is the job the next free worker of the pool takes. Uses the index
    (pool, state, priority, id): one index range count per job.
    """
    ids = [j.id for j in queued if j.state == JobState.QUEUED]
    if not ids:
        return {}
    rows = session.execute(_places_statement(), {"ids": ids}).all()
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
    if job.state == JobState.STARTING:  # what its worker prepares ("fetching input corpus: ...")
        return job.wait_reason
    return None
