"""What jobs used: slot-seconds (GPU-seconds on GPU pools) and CPU-seconds per node and attempt.

A node of an attempt holds `len(devices)` slots (`job_nodes.devices`; `jobs.slots` for rows
from before 0008) from `joined_at` until `ended_at` (now, while it runs; its last heartbeat
when its attempt is over but no end was recorded). Its slot-seconds are
the product. Its CPU-seconds (`job_nodes.cpu_seconds`) are what its worker measured over the
node's torchrun process tree; a part of the node's interval gets the same share of them as of
its wall time (a day of a node that ran over midnight). Cost is slot-hours times the pool's
price (`TORCHYARD_SLOT_PRICES`). Quotas (the monthly GPU-hour budget), usage reports
(`core.usage.report`) and cost all start here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from core.jobs.service import ACTIVE_STATES
from core.platform.tables import Job, JobNode, aware, utcnow


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
    cpu_seconds: float = 0.0  # the whole node's, as its worker last measured them

    def interval(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        now: datetime | None = None,
    ) -> tuple[datetime, datetime]:
        """The part of the node's [joined, ended) inside [since, until); a running node ends
        `now` (default: the clock). Empty (end <= start) when they do not overlap."""
        start = max(self.started_at, since) if since is not None else self.started_at
        end = self.ended_at or now or utcnow()
        if until is not None:
            end = min(end, until)
        return start, end

    def slot_seconds(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        now: datetime | None = None,
    ) -> float:
        """Slot-seconds inside [since, until) (open ends: the node's own; until: now)."""
        start, end = self.interval(since=since, until=until, now=now)
        return max(0.0, (end - start).total_seconds()) * self.slots

    def cpu_share(self, start: datetime, end: datetime, *, now: datetime | None = None) -> float:
        """The node's CPU-seconds that fall in [start, end): its share of the node's wall time
        (all of them for a node of zero length that starts inside)."""
        node_start, node_end = self.interval(now=now)
        wall = (node_end - node_start).total_seconds()
        if wall <= 0:
            return self.cpu_seconds if start <= node_start < end else 0.0
        part = (min(end, node_end) - max(start, node_start)).total_seconds()
        return self.cpu_seconds * max(0.0, part) / wall

    def by_day(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        now: datetime | None = None,
    ) -> list[DayUsage]:
        """Slot- and CPU-seconds per UTC day inside [since, until), oldest day first."""
        start, end = self.interval(since=since, until=until, now=now)
        out = []
        for day, seconds in split_days(start, end):
            lo = max(start, day_start(day))
            hi = min(end, day_start(day + timedelta(days=1)))
            out.append(DayUsage(day, seconds * self.slots, self.cpu_share(lo, hi, now=now)))
        return out


@dataclass(frozen=True)
class DayUsage:
    """What one node used on one UTC day."""

    day: date
    slot_seconds: float
    cpu_seconds: float


def day_start(day: date) -> datetime:
    """00:00 UTC of `day`."""
    return datetime.combine(day, time(0), tzinfo=UTC)


def split_days(start: datetime, end: datetime) -> list[tuple[date, float]]:
    """[start, end) cut at each UTC midnight: (day, seconds in it), oldest first; [] when
    end <= start. Naive datetimes are UTC."""
    start, end = aware(start).astimezone(UTC), aware(end).astimezone(UTC)
    out = []
    while start < end:
        next_midnight = day_start(start.date() + timedelta(days=1))
        cut = min(end, next_midnight)
        out.append((start.date(), (cut - start).total_seconds()))
        start = cut
    return out


def price_of(pool: str, prices: Mapping[str, float]) -> float | None:
    """The price of one slot-hour in `pool` (`TORCHYARD_SLOT_PRICES`); None: no price."""
    return prices.get(pool)


def cost(slot_seconds: float, pool: str, prices: Mapping[str, float]) -> float:
    """What `slot_seconds` in `pool` cost: slot-hours x the pool's price (0 without one)."""
    return slot_seconds / 3600.0 * (price_of(pool, prices) or 0.0)


def as_utc(value: datetime) -> datetime:
    """`value` in UTC; a naive value is taken to be UTC already."""
    return aware(value).astimezone(UTC)


def node_usage(
    *,
    session: Session,
    project_id: str | None = None,
    pool: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    job_ids: Sequence[int] | None = None,
) -> list[NodeUsage]:
    """The nodes that held slots at some time in [since, until), optionally of one project,
    pool and/or some jobs, oldest first."""
    query = (
        select(JobNode, Job.project_id, Job.pool, Job.slots, Job.attempt, Job.state)
        .join(Job, Job.id == JobNode.job_id)
        .where(JobNode.joined_at.is_not(None))
    )
    if project_id is not None:
        query = query.where(Job.project_id == project_id)
    if pool is not None:
        query = query.where(Job.pool == pool)
    if job_ids is not None:
        query = query.where(JobNode.job_id.in_(list(job_ids)))
    if since is not None:
        query = query.where(or_(JobNode.ended_at.is_(None), JobNode.ended_at > since))
    if until is not None:
        query = query.where(JobNode.joined_at < until)
    rows = session.execute(query.order_by(JobNode.joined_at, JobNode.job_id)).all()
    out = []
    for node, row_project, row_pool, job_slots, job_attempt, job_state in rows:
        assert node.joined_at is not None
        ended_at = node.ended_at
        if ended_at is None and (job_attempt != node.attempt or job_state not in ACTIVE_STATES):
            # Its attempt ended without recording this node's end (it never launched, its gang
            # was released, its worker was lost): it held its slots until its last heartbeat.
            ended_at = node.heartbeat_at or node.joined_at
        out.append(
            NodeUsage(
                job_id=node.job_id,
                project_id=row_project,
                pool=row_pool,
                attempt=node.attempt,
                node_rank=node.node_rank,
                slots=len(node.devices) if node.devices else job_slots,
                started_at=aware(node.joined_at),
                ended_at=aware(ended_at) if ended_at is not None else None,
                cpu_seconds=float(node.cpu_seconds or 0.0),
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
    since_aware = aware(since) if since is not None else None
    until_aware = aware(until) if until is not None else None
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
