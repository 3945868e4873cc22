"""Queue transparency: a waiting job's place in its pool, why it waits, and when it may start.

`pool_queue` replays the claim (`core.scheduling.claim.claim_next`) forward in time: the live
workers of the pool with their free devices, the running jobs that free theirs at their ETA
(`core.jobs.runtime.seconds_left`: the recent step time, else the run's average over all its
attempts, times the steps left; unknown for a job that reports no steps or no `max_steps`; now
for a job cancelling, pausing or preempting), and the queued jobs, taken in claim order
(quotas, fair share, priority, age) whenever one fits. A job's `position` is its place in that
order (1-based; jobs the replay cannot place follow, in claim order), `estimated_start_at` when
the replay places it (None when it depends on an unknown ETA, a budget, or a worker that does
not exist). Jobs it places never end in the replay: their runtime is unknown.

Reasons: `quota gpus 2/2`, `quota running jobs 3/3`, `budget exhausted` (a quota of the
project), `behind priority 50` (the highest priority ahead of it), `no free worker`,
`claimable now` (a free worker fits it; a claim is under way), `slurm PENDING (Resources), Slurm
job 12` (a job of a Slurm pool that Slurm holds, with Slurm's start estimate: `workers.slurm`),
`preempting job 12` (jobs of lower priority checkpoint and yield their devices to it,
`core.scheduling.preemption_apply`), and for jobs that are not queued: `gang assembling 1/2` (a
claimed multi-node job waiting for its other nodes), `paused`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.jobs import runtime
from core.platform.tables import Job, JobNode, JobState, SlurmJob, Worker, aware, utcnow
from core.scheduling import preemption_apply as preempt
from core.scheduling import quotas


@dataclass(frozen=True)
class QueueInfo:
    """Where a waiting job stands: `position` in its pool (1-based, claim order; None when
    not queued), `reason` in words, `estimated_start_at` (None: unknown)."""

    position: int | None
    reason: str
    estimated_start_at: datetime | None


@dataclass(frozen=True)
class Queued:
    """A queued job as the replay sees it: `slots` per node, `size` = slots x nodes."""

    id: int
    project_id: str
    priority: int
    slots: int
    size: int

    @property
    def nodes(self) -> int:
        return max(1, self.size // max(1, self.slots))


@dataclass(frozen=True)
class Release:
    """A running job of `project_id` ending `at` (its ETA), freeing `size` devices."""

    at: datetime
    project_id: str
    size: int
    devices: tuple[tuple[str, int], ...]  # (worker, devices) per node


def _live_workers(
    session: Session, pool: str, now: datetime, worker_timeout_s: float
) -> dict[str, int]:
    """{worker: free devices} of the live, not stopping workers that serve `pool`."""
    rows = session.execute(
        select(Worker.name, Worker.pool, Worker.slots_free, Worker.heartbeat_at).where(
            Worker.stopping.is_(False)
        )
    ).all()
    cutoff = now - timedelta(seconds=worker_timeout_s)
    return {
        name: int(free or 0)
        for name, pools, free, beat in rows
        if pool in pools.split(",") and aware(beat) >= cutoff
    }


def _releases(session: Session, pool: str, now: datetime) -> list[Release]:
    """When each active job of the pool frees its devices, for those with a known ETA (a job
    that is stopping, cancelling, pausing or preempting: now)."""
    holding = (Job.pool == pool, Job.state.in_(quotas.HOLDING))
    active = session.execute(
        select(
            Job.id,
            Job.project_id,
            Job.slots,
            Job.state,
            Job.started_at,
            Job.current_step,
            Job.max_steps,
            Job.runtime_s,
            Job.latest_metrics,
            quotas.job_size(),
        ).where(*holding)
    ).all()
    nodes: dict[int, list[tuple[str, int]]] = {}
    for job_id, worker, devices, slots in session.execute(
        select(JobNode.job_id, JobNode.worker, JobNode.devices, Job.slots)
        .join(Job, (Job.id == JobNode.job_id) & (Job.attempt == JobNode.attempt))
        .where(*holding, JobNode.worker.is_not(None), JobNode.ended_at.is_(None))
    ):
        nodes.setdefault(job_id, []).append((str(worker), len(devices) if devices else slots))
    out = []
    for row in active:
        eta = runtime.seconds_left(
            state=row.state,
            current_step=row.current_step,
            max_steps=row.max_steps,
            runtime_s=row.runtime_s,
            started_at=row.started_at,
            latest_metrics=row.latest_metrics,
            now=now,
        )
        if row.state in preempt.LEAVING:  # checkpointing to stop: its devices free soon
            eta = 0.0
        if eta is not None:
            at = now + timedelta(seconds=eta)
            out.append(Release(at, row.project_id, row[-1], tuple(nodes.get(row.id, ()))))
    return sorted(out, key=lambda r: r.at)


def _place(free: dict[str, int], slots: int, nodes: int) -> list[str] | None:
    """`nodes` distinct workers with `slots` free devices each (best fit), or None."""
    fitting = sorted((n for n, f in free.items() if f >= slots), key=lambda n: (free[n], n))
    return fitting[:nodes] if len(fitting) >= nodes else None


def _order_key(standings: dict[str, quotas.Standing], job: Queued) -> tuple[float, int, int]:
    return (standings[job.project_id].share, -job.priority, job.id)


def _claimable(jobs: list[Queued], standing: quotas.Standing) -> Iterator[Queued]:
    return (j for j in jobs if standing.blocked(j.size) is None)


def _claim_order(
    by_project: dict[str, list[Queued]], standings: dict[str, quotas.Standing]
) -> Iterator[Queued]:
    """The pending jobs within their quotas in claim order, lazily: each project's jobs by
    priority and age, merged by (the project's share, priority, age)."""
    streams = [
        _claimable(jobs, standings[p])
        for p, jobs in by_project.items()
        if standings[p].blocked() is None
    ]
    return heapq.merge(*streams, key=lambda j: _order_key(standings, j))


def replay(
    queued: list[Queued],
    standings: dict[str, quotas.Standing],
    free: dict[str, int],
    releases: list[Release],
    now: datetime,
    wanted: set[int],
) -> tuple[list[int], dict[int, datetime]]:
    """Claim order of the queued jobs, up to the last of `wanted`, and the start times of
    those the replay places. Once no release with a known time is left, the order goes on as
    if devices were unlimited (no start times); jobs over a quota then come last."""
    by_project: dict[str, list[Queued]] = {}
    for job in sorted(queued, key=lambda j: (-j.priority, j.id)):
        by_project.setdefault(job.project_id, []).append(job)
    order: list[int] = []
    starts: dict[int, datetime] = {}
    events = list(releases)
    t: datetime | None = now
    missing = set(wanted)
    while missing:
        candidates = _claim_order(by_project, standings)
        placed: tuple[Queued, list[str]] | None
        if t is None:  # unbounded: order only
            placed = next(((j, []) for j in candidates), None)
        else:
            placed = next(
                ((j, w) for j in candidates if (w := _place(free, j.slots, j.nodes))), None
            )
        if placed is not None:
            job, workers = placed
            for name in workers:
                free[name] -= job.slots
            standings[job.project_id].start(job.size)
            order.append(job.id)
            missing.discard(job.id)
            if t is not None:
                starts[job.id] = t
            by_project[job.project_id].remove(job)
        elif t is None:
            rest = [j for jobs in by_project.values() for j in jobs]
            order += [j.id for j in sorted(rest, key=lambda j: _order_key(standings, j))]
            break
        elif not events:
            t = None
        else:
            event = events.pop(0)
            t = max(t, event.at)
            for name, count in event.devices:
                if name in free:
                    free[name] += count
            if event.project_id in standings:
                standings[event.project_id].end(event.size)
    return order, starts


def pool_queue(
    *,
    session: Session,
    pool: str,
    worker_timeout_s: float,
    now: datetime | None = None,
    wanted: set[int] | None = None,
) -> dict[int, QueueInfo]:
    """{job id: QueueInfo} for the queued jobs of `pool` (`wanted`: at least these; None:
    all) (module docstring). Reads every queued job of the pool; replays up to the last
    wanted one."""
    now = now or utcnow()
    rows = session.execute(
        select(Job.id, Job.project_id, Job.priority, Job.slots, quotas.job_size()).where(
            Job.pool == pool, Job.state == JobState.QUEUED
        )
    ).all()
    if not rows:
        return {}
    queued = [Queued(*row) for row in rows]
    standings = quotas.standings(
        session=session, pool=pool, project_ids=sorted({j.project_id for j in queued})
    )
    now_standings = {p: s.clone() for p, s in standings.items()}
    order, starts = replay(
        queued,
        standings,
        _live_workers(session, pool, now, worker_timeout_s),
        _releases(session, pool, now),
        now,
        {j.id for j in queued} if wanted is None else wanted & {j.id for j in queued},
    )
    by_id = {j.id: j for j in queued}
    yielding = preempt.yielding(session=session, pool=pool)
    out: dict[int, QueueInfo] = {}
    highest = None
    for position, job_id in enumerate(order, start=1):
        job = by_id[job_id]
        start = starts.get(job_id)
        reason = now_standings[job.project_id].blocked(job.size)
        if reason is None and highest is not None and highest > job.priority:
            reason = f"behind priority {highest}"
        if job_id in yielding:
            victims = yielding[job_id]
            reason = f"preempting job{'s' if len(victims) > 1 else ''} " + ", ".join(
                str(v) for v in victims
            )
        if reason is None:
            reason = "claimable now" if start == now else "no free worker"
        out[job_id] = QueueInfo(position=position, reason=reason, estimated_start_at=start)
        highest = job.priority if highest is None else max(highest, job.priority)
    return out


def _slurm_held(
    session: Session, queued: Sequence[Job], infos: dict[int, QueueInfo]
) -> dict[int, QueueInfo]:
    """Queued jobs that Slurm holds (a live `slurm_jobs` row, `workers.slurm`): Slurm's state
    and reason (`slurm PENDING (Resources)`) and its start estimate, the position kept."""
    if not queued:
        return {}
    rows = session.execute(
        select(SlurmJob.job_id, SlurmJob.slurm_job_id, SlurmJob.state, SlurmJob.reason,
               SlurmJob.start_at)
        .where(SlurmJob.job_id.in_([j.id for j in queued]), SlurmJob.ended_at.is_(None))
    ).all()  # fmt: skip
    out = {}
    for row in rows:
        why = f" ({row.reason})" if row.reason else ""
        where = f", Slurm job {row.slurm_job_id}" if row.slurm_job_id is not None else ""
        known = infos.get(row.job_id)
        start = aware(row.start_at) if row.start_at is not None else None
        out[row.job_id] = QueueInfo(
            known.position if known else None, f"slurm {row.state}{why}{where}", start
        )
    return out


def queue_infos(
    *, session: Session, jobs: Sequence[Job], worker_timeout_s: float
) -> dict[int, QueueInfo]:
    """{job id: QueueInfo} for the waiting ones of `jobs`: queued (one replay per pool), a
    gang assembling (starting, not every node joined), or paused."""
    out: dict[int, QueueInfo] = {}
    now = utcnow()
    wanted = {j.id for j in jobs}
    for pool in sorted({j.pool for j in jobs if j.state == JobState.QUEUED}):
        view = pool_queue(
            session=session, pool=pool, worker_timeout_s=worker_timeout_s, now=now, wanted=wanted
        )
        out.update({k: v for k, v in view.items() if k in wanted})
    out.update(_slurm_held(session, [j for j in jobs if j.state == JobState.QUEUED], out))
    gangs = [j for j in jobs if j.state == JobState.STARTING and j.spec.resources.nodes > 1]
    for job, joined in _joined(session, gangs).items():
        nodes = job.spec.resources.nodes
        if joined < nodes:
            out[job.id] = QueueInfo(None, f"gang assembling {joined}/{nodes}", None)
    for job in jobs:
        if job.state == JobState.PAUSED:
            out[job.id] = QueueInfo(None, "paused", None)
    return out


def _joined(session: Session, gangs: list[Job]) -> dict[Job, int]:
    if not gangs:
        return {}
    counts: dict[tuple[Any, Any], int] = {
        (job_id, attempt): int(n)
        for job_id, attempt, n in session.execute(
            select(JobNode.job_id, JobNode.attempt, func.count())
            .where(JobNode.job_id.in_([j.id for j in gangs]), JobNode.worker.is_not(None))
            .group_by(JobNode.job_id, JobNode.attempt)
        )
    }
    return {j: counts.get((j.id, j.attempt), 0) for j in gangs}
