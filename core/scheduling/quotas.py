"""Quotas and fair-share weights per project and pool, and a project's standing against them.

A `quotas` row limits one project on one pool, or on every pool together (pool `*`); both
rows apply to a job of that pool. A None limit is no limit. Limits:

- `max_slots`: devices (GPUs, CPU slots) the project's active jobs hold at once; a job holds
  `slots x nodes` (`resources.procs_per_node x resources.nodes`).
- `max_running_jobs`: active jobs (starting, running, pausing, preempting, cancelling).
- `max_queued_jobs`: queued jobs, checked at submission (`check_submit`: 429, Retry-After).
- `monthly_slot_hours`: slot-hours (GPU-hours on GPU pools) in the calendar month (UTC),
  counted by `core.usage.accounting.slot_seconds`.

`weight` (default 1; the pool's row, else the `*` row) is the project's share of a pool:
the claim prefers the project with the fewest active slots per weight (`core.scheduling.claim`).
The first three limits and the budget are enforced by the claim; a job over one waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ColumnElement, func, select, type_coerce
from sqlalchemy.orm import Session

from core.platform.errors import QuotaExceeded
from core.platform.tables import Job, JobState, Quota, utcnow
from core.usage import accounting as usage

ALL_POOLS = "*"
# Active states hold devices (core.jobs.service.ACTIVE_STATES, repeated to keep this module
# leaf-like).
HOLDING = (
    JobState.STARTING,
    JobState.RUNNING,
    JobState.CANCELLING,
    JobState.PAUSING,
    JobState.PREEMPTING,
)
LIMIT_FIELDS = ("max_slots", "max_running_jobs", "max_queued_jobs", "monthly_slot_hours")


def job_size() -> ColumnElement[int]:
    """SQL: the devices a job holds when it runs, `slots x resources.nodes`."""
    nodes = type_coerce(Job.spec, JSON)["resources"]["nodes"].as_integer()
    return Job.slots * func.coalesce(nodes, 1)


@dataclass
class Use:
    """What a project holds: `slots` devices in `jobs` active jobs."""

    slots: int = 0
    jobs: int = 0


def active_use(
    *, session: Session, project_ids: list[str] | None = None
) -> dict[str, dict[str, Use]]:
    """{project: {pool: Use}} of active jobs (the projects', or every project's)."""
    query = (
        select(Job.project_id, Job.pool, func.count(), func.coalesce(func.sum(job_size()), 0))
        .where(Job.state.in_(HOLDING))
        .group_by(Job.project_id, Job.pool)
    )
    if project_ids is not None:
        query = query.where(Job.project_id.in_(project_ids))
    out: dict[str, dict[str, Use]] = {}
    for project_id, pool, jobs, slots in session.execute(query):
        out.setdefault(project_id, {})[pool] = Use(slots=int(slots), jobs=int(jobs))
    return out


def _total(uses: dict[str, Use]) -> Use:
    return Use(slots=sum(u.slots for u in uses.values()), jobs=sum(u.jobs for u in uses.values()))


@dataclass
class Standing:
    """One project on one pool now: its applicable quota rows, what it holds there and on
    every pool, and the slot-hours it used this month (per quota row with a budget)."""

    project_id: str
    pool: str
    rows: list[Quota] = field(default_factory=list)
    use_pool: Use = field(default_factory=Use)
    use_all: Use = field(default_factory=Use)
    hours: dict[str, float] = field(default_factory=dict)

    @property
    def weight(self) -> float:
        own = [r for r in self.rows if r.pool == self.pool] or self.rows
        return own[0].weight if own and own[0].weight > 0 else 1.0

    @property
    def share(self) -> float:
        """Active slots on the pool per weight: lower is served first."""
        return self.use_pool.slots / self.weight

    def use(self, row: Quota) -> Use:
        return self.use_all if row.pool == ALL_POOLS else self.use_pool

    def blocked(self, size: int = 1, *, held: bool = True) -> str | None:
        """Why a job of `size` devices may not start now (`budget exhausted`, `quota running
        jobs 3/3`, `quota gpus 2/2`: held/limit), or None. `held=False` leaves out the limits
        on what the project holds, running jobs and slots (preemption within the project makes
        room under them: `core.scheduling.preemption_apply`)."""
        for row in self.rows:
            limit = row.monthly_slot_hours
            if limit is not None and self.hours.get(row.pool, 0.0) >= limit:
                return "budget exhausted"
        if not held:
            return None
        for row in self.rows:
            use = self.use(row)
            if row.max_running_jobs is not None and use.jobs >= row.max_running_jobs:
                return f"quota running jobs {use.jobs}/{row.max_running_jobs}"
        for row in self.rows:
            use = self.use(row)
            if row.max_slots is not None and use.slots + size > row.max_slots:
                return f"quota gpus {use.slots}/{row.max_slots}"
        return None

    def room(self) -> int | None:
        """The most devices one more job may hold (None: no slot limit)."""
        rooms = [r.max_slots - self.use(r).slots for r in self.rows if r.max_slots is not None]
        return min(rooms) if rooms else None

    def jobs_room(self) -> int | None:
        """How many more jobs may be active (None: no running-jobs limit; negative: over it)."""
        rooms = [
            r.max_running_jobs - self.use(r).jobs
            for r in self.rows
            if r.max_running_jobs is not None
        ]
        return min(rooms) if rooms else None

    def clone(self) -> Standing:
        """A copy whose usage can change (the quota rows are shared)."""
        return Standing(
            project_id=self.project_id,
            pool=self.pool,
            rows=self.rows,
            use_pool=Use(**vars(self.use_pool)),
            use_all=Use(**vars(self.use_all)),
            hours=dict(self.hours),
        )

    def start(self, size: int) -> None:
        """Count a job of `size` devices as started (the queue's simulation)."""
        for use in (self.use_pool, self.use_all):
            use.slots += size
            use.jobs += 1

    def end(self, size: int) -> None:
        """Count a job of `size` devices as ended (the queue's simulation)."""
        for use in (self.use_pool, self.use_all):
            use.slots = max(0, use.slots - size)
            use.jobs = max(0, use.jobs - 1)


def month_hours(
    *, session: Session, project_id: str, pool: str, now: datetime | None = None
) -> float:
    """Slot-hours the project used this calendar month (UTC) on `pool` (`*`: every pool)."""
    seconds = usage.slot_seconds(
        session=session,
        project_id=project_id,
        pool=None if pool == ALL_POOLS else pool,
        since=usage.month_start(now),
    )
    return seconds / 3600.0


def rows_for(
    *, session: Session, pool: str, project_ids: list[str], lock: bool = False
) -> list[Quota]:
    """The quota rows that apply to jobs of `pool` for these projects, by (project, pool);
    `lock`: `SELECT ... FOR UPDATE` (the claim serialises claims of a limited project)."""
    if not project_ids:
        return []
    query = (
        select(Quota)
        .where(Quota.project_id.in_(project_ids), Quota.pool.in_([pool, ALL_POOLS]))
        .order_by(Quota.project_id, Quota.pool)
    )
    if lock:
        query = query.with_for_update().execution_options(populate_existing=True)
    return list(session.execute(query).scalars())


def standings(
    *, session: Session, pool: str, project_ids: list[str], lock: bool = False
) -> dict[str, Standing]:
    """{project: Standing} on `pool` for these projects: a few small queries, plus one usage
    read per monthly budget."""
    out = {p: Standing(project_id=p, pool=pool) for p in project_ids}
    for row in rows_for(session=session, pool=pool, project_ids=project_ids, lock=lock):
        out[row.project_id].rows.append(row)
    uses = active_use(session=session, project_ids=project_ids)
    for project_id, standing in out.items():
        mine = uses.get(project_id, {})
        standing.use_pool = Use(**vars(mine.get(pool, Use())))
        standing.use_all = _total(mine)
        for row in standing.rows:
            if row.monthly_slot_hours is not None:
                standing.hours[row.pool] = month_hours(
                    session=session, project_id=project_id, pool=row.pool
                )
    return out


def queued_count(*, session: Session, project_id: str, pool: str) -> int:
    """Queued jobs of the project on `pool` (`*`: every pool)."""
    query = select(func.count()).where(Job.project_id == project_id, Job.state == JobState.QUEUED)
    if pool != ALL_POOLS:
        query = query.where(Job.pool == pool)
    return int(session.execute(query).scalar_one())


def check_submit(
    *,
    session: Session,
    project_id: str,
    pool: str,
    retry_after_s: int,
    idempotency_key: str | None = None,
) -> None:
    """Refuse one more queued job on `pool` past a `max_queued_jobs`; a retry with the
    `idempotency_key` of a job already made passes (it makes nothing).

    Raises QuotaExceeded (429, `Retry-After: retry_after_s`). One small query when the project
    has no quota (the submit path). With a queued limit the quota rows stay locked
    (`SELECT ... FOR UPDATE`) until the caller's transaction ends: concurrent submissions of the
    project to the pool count one after the other, so a burst cannot overshoot the limit."""
    rows = rows_for(session=session, pool=pool, project_ids=[project_id])
    if all(row.max_queued_jobs is None for row in rows):
        return
    if idempotency_key is not None and _made(session, project_id, idempotency_key):
        return
    for row in rows_for(session=session, pool=pool, project_ids=[project_id], lock=True):
        if row.max_queued_jobs is None:
            continue
        queued = queued_count(session=session, project_id=project_id, pool=row.pool)
        if queued >= row.max_queued_jobs:
            raise QuotaExceeded(
                f"quota queued jobs {queued}/{row.max_queued_jobs} on pool {row.pool!r}: "
                "wait until some of the project's jobs start",
                retry_after_s=retry_after_s,
                details=[
                    {
                        "loc": ["body", "resources", "pool"],
                        "msg": f"quota queued jobs {queued}/{row.max_queued_jobs}",
                        "type": "quota_exceeded",
                    }
                ],
            )


def _made(session: Session, project_id: str, idempotency_key: str) -> bool:
    query = select(Job.id).where(
        Job.project_id == project_id, Job.idempotency_key == idempotency_key
    )
    return session.execute(query).first() is not None


def waiting_heads(*, session: Session, project_id: str, pool: str) -> list[Job]:
    """The oldest queued job of the project on each pool `pool` covers (`*`: every pool): what
    to wake the pools with once its quota changed (a claim message is a token for a pool)."""
    query = select(func.min(Job.id)).where(
        Job.project_id == project_id, Job.state == JobState.QUEUED
    )
    if pool != ALL_POOLS:
        query = query.where(Job.pool == pool)
    ids = list(session.execute(query.group_by(Job.pool)).scalars())
    return list(session.execute(select(Job).where(Job.id.in_(ids))).scalars()) if ids else []


@dataclass(frozen=True)
class QuotaUsage:
    """A quota row and what the project uses against it now."""

    quota: Quota
    slots_in_use: int
    running_jobs: int
    queued_jobs: int
    slot_hours_this_month: float


def usage_of(*, session: Session, quota: Quota, uses: dict[str, Use] | None = None) -> QuotaUsage:
    """Usage against one quota row (`uses`: the project's `active_use`, when read already)."""
    if uses is None:
        uses = active_use(session=session, project_ids=[quota.project_id]).get(quota.project_id, {})
    use = _total(uses) if quota.pool == ALL_POOLS else uses.get(quota.pool, Use())
    return QuotaUsage(
        quota=quota,
        slots_in_use=use.slots,
        running_jobs=use.jobs,
        queued_jobs=queued_count(session=session, project_id=quota.project_id, pool=quota.pool),
        slot_hours_this_month=month_hours(
            session=session, project_id=quota.project_id, pool=quota.pool
        ),
    )


def list_quotas(*, session: Session, project_id: str) -> list[QuotaUsage]:
    """The project's quota rows by pool (`*` first), each with its usage."""
    rows = session.execute(
        select(Quota).where(Quota.project_id == project_id).order_by(Quota.pool)
    ).scalars()
    uses = active_use(session=session, project_ids=[project_id]).get(project_id, {})
    return [usage_of(session=session, quota=row, uses=uses) for row in rows]


def put_quota(
    *, session: Session, project_id: str, pool: str, values: dict[str, Any]
) -> QuotaUsage:
    """Set the project's quota on `pool` (`*`: every pool): every limit in LIMIT_FIELDS (None:
    none) and `weight` (default 1), replacing the row. Commits. Values are validated by the
    caller (api.schemas.QuotaIn)."""
    row = session.get(Quota, (project_id, pool))
    if row is None:
        row = Quota(project_id=project_id, pool=pool)
        session.add(row)
    for name in LIMIT_FIELDS:
        setattr(row, name, values.get(name))
    row.weight = float(values.get("weight") or 1.0)
    row.updated_at = utcnow()
    session.commit()
    return usage_of(session=session, quota=row)
