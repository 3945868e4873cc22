"""Usage reports: a project's slot-seconds, CPU-seconds and cost per day, pool or job, and
each job's own totals (`GET /v1/usage`, `GET /v1/jobs/{id}`, `limits.max_cost`).

Built on `core.usage.accounting.node_usage`: every node of every attempt that overlaps the window,
cut at UTC midnight for days; a node still running counts up to now. Cost is computed per node
from its pool's price before the rows are added up, so a day of two pools costs what each did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.platform.errors import InvalidInput
from core.platform.tables import Job, utcnow
from core.usage import accounting as usage
from jobspec.job import AnySpec

GroupBy = Literal["day", "pool", "job"]
GROUP_BY: tuple[GroupBy, ...] = ("day", "pool", "job")


@dataclass
class Totals:
    """Slot-seconds, CPU-seconds and cost (in the settings' currency) of some usage."""

    slot_seconds: float = 0.0
    cpu_seconds: float = 0.0
    cost: float = 0.0

    def add(self, slot_seconds: float, cpu_seconds: float, cost: float) -> None:
        self.slot_seconds += slot_seconds
        self.cpu_seconds += cpu_seconds
        self.cost += cost


@dataclass
class UsageRow(Totals):
    """One row of a report: the group's key (`day`, `pool`, or `job_id` with its name and
    pool; the other keys None) and its totals."""

    day: date | None = None
    pool: str | None = None
    job_id: int | None = None
    job_name: str | None = None


@dataclass(frozen=True)
class Report:
    """A project's usage in [since, until), grouped by `group_by`, with the overall total."""

    since: datetime
    until: datetime
    group_by: GroupBy
    currency: str
    rows: list[UsageRow]
    total: Totals = field(default_factory=Totals)
    # Pools with usage in the window and no slot-hour price (TORCHYARD_SLOT_PRICES): their
    # slot-hours cost 0, which a report must say rather than chart as a cost of zero.
    unpriced_pools: list[str] = field(default_factory=list)


def report(
    *,
    session: Session,
    project_id: str,
    since: datetime,
    until: datetime,
    group_by: GroupBy,
    prices: Mapping[str, float],
    currency: str,
    now: datetime | None = None,
) -> Report:
    """The project's usage in [since, until) (UTC; naive values are UTC) per `group_by`.

    Rows are ordered by their key (day, pool name, job id). Raises InvalidInput (422, at
    `["query", "until"]`) when `until` is not after `since`."""
    since, until = usage.as_utc(since), usage.as_utc(until)
    if until <= since:
        raise InvalidInput(
            "until must be after since",
            details=[{"loc": ["query", "until"], "msg": "not after since", "type": "value_error"}],
        )
    now = now or utcnow()
    nodes = usage.node_usage(session=session, project_id=project_id, since=since, until=until)
    names = _job_names(session, {n.job_id for n in nodes}) if group_by == "job" else {}
    rows: dict[tuple[str, int], UsageRow] = {}
    total = Totals()
    unpriced: set[str] = set()
    for node in nodes:
        if usage.price_of(node.pool, prices) is None:
            unpriced.add(node.pool)
        for part in node.by_day(since=since, until=until, now=now):
            key, row = _row(group_by, node, part.day, names)
            price = usage.cost(part.slot_seconds, node.pool, prices)
            rows.setdefault(key, row).add(part.slot_seconds, part.cpu_seconds, price)
            total.add(part.slot_seconds, part.cpu_seconds, price)
    ordered = [rows[k] for k in sorted(rows)]
    return Report(since, until, group_by, currency, ordered, total, sorted(unpriced))


def _row(
    group_by: GroupBy, node: usage.NodeUsage, day: date, names: Mapping[int, str]
) -> tuple[tuple[str, int], UsageRow]:
    """The row key (sortable: day, pool name, job id) and an empty row of `node`'s group."""
    if group_by == "day":
        return (day.isoformat(), 0), UsageRow(day=day)
    if group_by == "pool":
        return (node.pool, 0), UsageRow(pool=node.pool)
    row = UsageRow(job_id=node.job_id, job_name=names.get(node.job_id), pool=node.pool)
    return ("", node.job_id), row


def _job_names(session: Session, job_ids: Iterable[int]) -> dict[int, str]:
    ids = list(job_ids)
    if not ids:
        return {}
    rows = session.execute(select(Job.id, Job.name).where(Job.id.in_(ids))).all()
    return {job_id: name for job_id, name in rows}


def job_usage(
    *,
    session: Session,
    job_ids: Sequence[int],
    prices: Mapping[str, float],
    now: datetime | None = None,
) -> dict[int, Totals]:
    """Every attempt's usage of each job in `job_ids` (all time; a running node up to now),
    by job id; a job that never held slots gets zeros. One query."""
    out = {job_id: Totals() for job_id in job_ids}
    if not job_ids:
        return out
    for node in usage.node_usage(session=session, job_ids=job_ids):
        seconds = node.slot_seconds(now=now)
        out[node.job_id].add(seconds, node.cpu_seconds, usage.cost(seconds, node.pool, prices))
    return out


def job_cost(
    *, session: Session, job_id: int, prices: Mapping[str, float], now: datetime | None = None
) -> float:
    """What job `job_id` cost so far, every attempt together (a running node up to now)."""
    return job_usage(session=session, job_ids=[job_id], prices=prices, now=now)[job_id].cost


def check_max_cost(spec: AnySpec, prices: Mapping[str, float]) -> None:
    """A spec with `limits.max_cost` must run on a pool with a price. Raises InvalidInput (422
    at `["body", "limits", "max_cost"]`) otherwise."""
    check_priced(spec.resources.pool, spec.limits.max_cost, prices)


def check_priced(pool: str, max_cost: float | None, prices: Mapping[str, float]) -> None:
    """A `max_cost` (a job's, or a sweep's over its trials) needs a price for `pool`, where its
    jobs run. Raises InvalidInput (422 at `["body", "limits", "max_cost"]`) otherwise."""
    if max_cost is not None and usage.price_of(pool, prices) is None:
        msg = f"pool {pool!r} has no slot-hour price (TORCHYARD_SLOT_PRICES), so no cost accrues"
        raise InvalidInput(
            f"limits.max_cost: {msg}",
            details=[{"loc": ["body", "limits", "max_cost"], "msg": msg, "type": "value_error"}],
        )
