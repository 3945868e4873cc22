"""Listing a project's jobs: filters, a sort order, and keyset pagination that stays fast and
exact at any depth (no OFFSET: each page starts after the last row of the previous one, by the
sort value with the job id as tie-breaker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func, tuple_, type_coerce
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.sql import Select, select

from core.platform.tables import Job, JobDataset

# Sort keys a client may ask for; "created" is the id (ids grow with creation time). Each has
# an index on (project_id, column, id) (migration 0003), so a page is an index range scan.
SORT_COLUMNS: dict[str, InstrumentedAttribute[Any]] = {
    "created": Job.id,
    "name": Job.name,
    "state": Job.state,
}
SORTS = tuple(f"{sign}{key}" for key in SORT_COLUMNS for sign in ("-", ""))
DEFAULT_SORT = "-created"


@dataclass(frozen=True)
class After:
    """Where a page ends: the last row's sort value and id."""

    sort: str
    value: str | int
    id: int


def _value(sort: str, job: Job) -> str | int:
    value: str | int = getattr(job, SORT_COLUMNS[sort.lstrip("-")].key)
    return value


def _after(query: Select[Job], after: After) -> Select[Job]:
    key = after.sort.lstrip("-")
    column = SORT_COLUMNS[key]
    descending = after.sort.startswith("-")
    if key == "created":
        return query.where(Job.id < after.id if descending else Job.id > after.id)
    row, mark = tuple_(column, Job.id), tuple_(after.value, after.id)
    return query.where(row < mark if descending else row > mark)


def _has_label(session: Session, key: str, value: str) -> ColumnElement[bool]:
    """`labels[key] == value`: JSONB containment on Postgres; on SQLite a `json_each` probe,
    which (unlike a JSON path) takes any key, quotes and dots included."""
    if session.get_bind().dialect.name == "postgresql":
        return type_coerce(Job.labels, JSONB).contains({key: value})
    each = func.json_each(Job.labels).table_valued("key", "value")
    return select(1).select_from(each).where(each.c.key == key, each.c.value == value).exists()


def list_page(
    *,
    session: Session,
    project_id: str,
    states: Sequence[str] = (),
    name: str | None = None,
    labels: Mapping[str, str] | None = None,
    dataset_id: str | None = None,
    sort: str = DEFAULT_SORT,
    limit: int = 50,
    after: After | None = None,
) -> tuple[list[Job], After | None]:
    """One page of the project's jobs in `sort` order (a key of SORT_COLUMNS, "-" first for
    descending; ties by id in the same direction), with every filter applied: `states` (any
    of), `name` (case-insensitive substring), `labels` (all of these key=value pairs),
    `dataset_id` (its spec names this dataset, in any field: `job_datasets`).

    Returns (jobs, where the next page starts or None at the end). Raises ValueError for an
    unknown sort or an `after` of another sort.
    """
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}")
    if after is not None and after.sort != sort:
        raise ValueError(f"a cursor of sort {after.sort!r} used with sort {sort!r}")
    query = select(Job).where(Job.project_id == project_id)
    if states:
        query = query.where(Job.state.in_(list(states)))
    if name:
        escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(Job.name.ilike(f"%{escaped}%", escape="\\"))
    for key, value in (labels or {}).items():
        query = query.where(_has_label(session, key, value))
    if dataset_id is not None:
        used = select(1).where(JobDataset.job_id == Job.id, JobDataset.dataset_id == dataset_id)
        query = query.where(used.exists())
    if after is not None:
        query = _after(query, after)
    column = SORT_COLUMNS[sort.lstrip("-")]
    if sort.startswith("-"):
        order = [column.desc(), Job.id.desc()] if column is not Job.id else [Job.id.desc()]
    else:
        order = [column.asc(), Job.id.asc()] if column is not Job.id else [Job.id.asc()]
    rows = list(session.execute(query.order_by(*order).limit(limit + 1)).scalars())
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], After(sort=sort, value=_value(sort, last), id=last.id)
