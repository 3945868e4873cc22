"""Idempotent ingestion of what a run reports: metric points, log lines, checkpoints.

Every row is keyed (metrics by job/name/step, logs by job/attempt/rank/stream/byte offset,
checkpoints by job/step), so a worker that re-reads a file after a crash upserts instead of
duplicating.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.models import Checkpoint, Job, LogLine, MetricPoint, utcnow


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    step: int
    value: float
    time: float


@dataclass(frozen=True, slots=True)
class Log:
    rank: int
    stream: str
    offset: int
    line: str


def _insert(session: Session, table: Any) -> Any:
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def metrics(*, session: Session, job_id: int, attempt: int, points: Sequence[Metric]) -> None:
    """Upsert points; the last value of each series also lands on the job row. No commit."""
    if not points:
        return
    if session.get_bind().dialect.name == "postgresql":
        _upsert_points_postgres(session, job_id, attempt, points)
    else:
        _upsert_points(session, job_id, attempt, points)
    _update_latest(session, job_id, points)


# One statement and one round trip for the whole batch (four arrays unnested server-side),
# instead of one statement per point. On the 2-core bench host the server-side upsert into
# the (job_id, name, step) key dominates either way (bench/ingest.py).
_PG_UPSERT = text(
    "INSERT INTO metric_points (job_id, name, step, value, attempt, time)"
    " SELECT :job_id, u.name, u.step, u.value, :attempt, u.time"
    " FROM unnest(CAST(:names AS text[]), CAST(:steps AS integer[]),"
    " CAST(:values AS float8[]), CAST(:times AS float8[])) AS u(name, step, value, time)"
    " ON CONFLICT (job_id, name, step) DO UPDATE"
    " SET value = EXCLUDED.value, attempt = EXCLUDED.attempt, time = EXCLUDED.time"
)


def _upsert_points_postgres(
    session: Session, job_id: int, attempt: int, points: Sequence[Metric]
) -> None:
    # A key may appear twice in a batch (a re-read line): the last one wins, as row by row.
    latest = {(p.name, p.step): p for p in points}
    batch = list(latest.values())
    session.execute(
        _PG_UPSERT,
        {
            "job_id": job_id,
            "attempt": attempt,
            "names": [p.name for p in batch],
            "steps": [p.step for p in batch],
            "values": [p.value for p in batch],
            "times": [p.time for p in batch],
        },
    )


def _upsert_points(session: Session, job_id: int, attempt: int, points: Sequence[Metric]) -> None:
    rows = [
        {
            "job_id": job_id,
            "name": p.name,
            "step": p.step,
            "value": p.value,
            "attempt": attempt,
            "time": p.time,
        }
        for p in points
    ]
    stmt = _insert(session, MetricPoint)
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "name", "step"],
        set_={
            "value": stmt.excluded.value,
            "attempt": stmt.excluded.attempt,
            "time": stmt.excluded.time,
        },
    )
    session.execute(stmt, rows)


def _update_latest(session: Session, job_id: int, points: Sequence[Metric]) -> None:
    job = session.get(Job, job_id)
    if job is not None:
        latest = dict(job.latest_metrics or {})
        for p in points:
            # JSON has no NaN/inf; the series keeps the true value, the summary says null.
            latest[p.name] = p.value if math.isfinite(p.value) else None
        step = max(p.step for p in points)
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                latest_metrics=latest,
                current_step=max(step, job.current_step or 0),
                updated_at=utcnow(),
            )
            .execution_options(synchronize_session="fetch")
        )


def logs(*, session: Session, job_id: int, attempt: int, lines: Sequence[Log]) -> None:
    """Insert log lines, skipping those already stored. No commit."""
    if not lines:
        return
    now = utcnow()
    rows = [
        {
            "job_id": job_id,
            "attempt": attempt,
            "rank": x.rank,
            "stream": x.stream,
            "offset": x.offset,
            "line": x.line,
            "created_at": now,
        }
        for x in lines
    ]
    stmt = _insert(session, LogLine).on_conflict_do_nothing(
        index_elements=["job_id", "attempt", "rank", "stream", "offset"]
    )
    session.execute(stmt, rows)


def checkpoint_deleted(*, session: Session, job_id: int, step: int) -> bool:
    """Forget a checkpoint that retention removed; False when it was not recorded. No commit."""
    result = session.execute(
        delete(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def checkpoint(
    *, session: Session, job_id: int, attempt: int, step: int, uri: str, size_bytes: int
) -> bool:
    """Record a complete checkpoint; returns False when it was already recorded. No commit."""
    stmt = (
        _insert(session, Checkpoint)
        .on_conflict_do_nothing(index_elements=["job_id", "step"])
        .returning(Checkpoint.id)
    )
    # A returned id says the row is new (rowcount is not reliable for INSERT ... ON CONFLICT).
    result = session.execute(
        stmt,
        {
            "job_id": job_id,
            "attempt": attempt,
            "step": step,
            "uri": uri,
            "size_bytes": size_bytes,
            "created_at": utcnow(),
        },
    )
    return result.first() is not None
