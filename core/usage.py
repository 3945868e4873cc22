"""What jobs used: slot-seconds (GPU-seconds on GPU pools) per node and attempt.

A node of an attempt holds `len(devices)` slots (`job_nodes.devices`; `jobs.slots` for rows
from before 0008) from `joined_at` until `ended_at` (now, while it runs). Its slot-seconds are
the product. Quotas (the monthly GPU-hour budget), usage reports and cost all start here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from core.models import Job, JobNode, utcnow


@dataclass(frozen=True)
class NodeUsage:
    """One node of one attempt: `slots` devices from `started_at` to `ended_at` (None: runs)."""

    job_id: int
    project_id: str
    pool: str
    attempt: int
    node_rank: int
    slots: int
    started_at: datetime
    ended_at: datetime | None

    def slot_seconds(
        self, *, since: datetime | None = None, until: datetime | None = None
    ) -> float:
        """Slot-seconds inside [since, until) (open ends: the node's own; until: now)."""
        start = max(self.started_at, since) if since is not None else self.started_at
        end = self.ended_at or utcnow()
        if until is not None:
            end = min(end, until)
        return max(0.0, (end - start).total_seconds()) * self.slots


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # SQLite: naive UTC


def node_usage(
    *,
    session: Session,
    project_id: str | None = None,
    pool: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[NodeUsage]:
    """The nodes that held slots at some time in [since, until), optionally of one project
    and/or pool, oldest first."""
    query = (
        select(JobNode, Job.project_id, Job.pool, Job.slots)
        .join(Job, Job.id == JobNode.job_id)
        .where(JobNode.joined_at.is_not(None))
    )
    if project_id is not None:
        query = query.where(Job.project_id == project_id)
    if pool is not None:
        query = query.where(Job.pool == pool)
    if since is not None:
        query = query.where(or_(JobNode.ended_at.is_(None), JobNode.ended_at > since))
    if until is not None:
        query = query.where(JobNode.joined_at < until)
    rows = session.execute(query.order_by(JobNode.joined_at, JobNode.job_id)).all()
    out = []
    for node, row_project, row_pool, job_slots in rows:
        assert node.joined_at is not None
        out.append(
            NodeUsage(
                job_id=node.job_id,
                project_id=row_project,
                pool=row_pool,
                attempt=node.attempt,
                node_rank=node.node_rank,
                slots=len(node.devices) if node.devices else job_slots,
                started_at=_aware(node.joined_at),
                ended_at=_aware(node.ended_at) if node.ended_at is not None else None,
            )
        )
    return out


def slot_seconds(
    *,
    session: Session,
    project_id: str,
    pool: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> float:
    """Slot-seconds the project's jobs (of `pool`, or all pools) used in [since, until)."""
    since_aware = _aware(since) if since is not None else None
    until_aware = _aware(until) if until is not None else None
    return sum(
        n.slot_seconds(since=since_aware, until=until_aware)
        for n in node_usage(
            session=session, project_id=project_id, pool=pool, since=since, until=until
        )
    )


def month_start(now: datetime | None = None) -> datetime:
    """00:00 UTC on the first day of `now`'s calendar month (UTC)."""
    now = (now or utcnow()).astimezone(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
