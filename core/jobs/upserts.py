"""Keyed upserts of what a run reports: metric points, log lines, checkpoints (the writes that
`core.jobs.reports` reads back; the worker's ingest, `workers.ingest`, calls them).

Every row is keyed (metrics by job/name/step, logs by job/attempt/rank/stream/byte offset,
checkpoints by job/step), so a worker that re-reads a file after a crash upserts instead of
duplicating.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import psycopg
from sqlalchemy import delete, text, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.util import identity_key

from core.platform.db import upsert_insert
from core.platform.tables import Checkpoint, Job, LogLine, MetricPoint, utcnow


class Metric(NamedTuple):
    """One point: series `name`, training `step`, `value`, trainer wall `time` (unix s).

    A named tuple, not a dataclass: the worker builds ~100,000 a second."""

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


def metrics(*, session: Session, job_id: int, attempt: int, points: Sequence[Metric]) -> None:
    """Upsert points; the last value of each series also lands on the job row. No commit."""
    if not points:
        return
    if session.get_bind().dialect.name == "postgresql":
        _upsert_points_postgres(session, job_id, attempt, points)
    else:
        _upsert_points(session, job_id, attempt, points)
    _update_latest(session, job_id, points)


# Points past the last stored step of their series cannot collide with a stored key: they go
# in by binary COPY, the cheapest way into the table. The rest (a re-read after a crash, an
# attempt resumed from an earlier checkpoint) go through one keyed upsert, which leaves rows
# whose values did not change alone. A race with another writer of the same job (which claim
# fencing rules out) would fail the COPY on the primary key and roll the flush back; the next
# flush then sees those keys as stored and upserts. The trigger of migration 0004 keeps
# `metric_rollups` in step with both statements.
_PG_LAST_STEPS = text(
    "SELECT n.name, (SELECT max(m.step) FROM metric_points m"
    "                WHERE m.job_id = :job_id AND m.name = n.name)"
    " FROM unnest(CAST(:names AS text[])) AS n(name)"
)
_PG_COPY = (
    "COPY metric_points (job_id, name, step, value, attempt, time) FROM STDIN (FORMAT BINARY)"
)
_PG_COPY_TYPES = ["int8", "text", "int4", "float8", "int4", "float8"]
_PG_UPSERT = text(
    "INSERT INTO metric_points AS m (job_id, name, step, value, attempt, time)"
    " SELECT :job_id, u.name, u.step, u.value, :attempt, u.time"
    " FROM unnest(CAST(:names AS text[]), CAST(:steps AS integer[]),"
    " CAST(:values AS float8[]), CAST(:times AS float8[])) AS u(name, step, value, time)"
    " ON CONFLICT (job_id, name, step) DO UPDATE"
    " SET value = EXCLUDED.value, attempt = EXCLUDED.attempt, time = EXCLUDED.time"
    " WHERE (m.value, m.attempt, m.time) IS DISTINCT FROM"
    " (EXCLUDED.value, EXCLUDED.attempt, EXCLUDED.time)"
)


def _upsert_points_postgres(
    session: Session, job_id: int, attempt: int, points: Sequence[Metric]
) -> None:
    names = sorted({p.name for p in points})
    rows = session.execute(_PG_LAST_STEPS, {"job_id": job_id, "names": names})
    last: dict[str, int] = {name: top for name, top in rows if top is not None}
    # One pass: a point past the last step of its series (stored, or earlier in this batch)
    # is fresh; any other (a re-read line, a resumed attempt, a key twice in the batch) is
    # upserted after the COPY, the last one of a key winning, as row by row.
    fresh: list[Metric] = []
    again: dict[tuple[str, int], Metric] = {}
    for p in points:
        if p.step > last.get(p.name, -(2**31) - 1):
            fresh.append(p)
            last[p.name] = p.step
        else:
            again[p.name, p.step] = p
    stored = list(again.values())
    raw = session.connection().connection.driver_connection
    if fresh and isinstance(raw, psycopg.Connection):
        with raw.cursor() as cursor, cursor.copy(_PG_COPY) as copy:
            copy.set_types(_PG_COPY_TYPES)
            for p in fresh:
                copy.write_row((job_id, p.name, p.step, p.value, attempt, p.time))
    else:
        stored += fresh
    if stored:
        session.execute(
            _PG_UPSERT,
            {
                "job_id": job_id,
                "attempt": attempt,
                "names": [p.name for p in stored],
                "steps": [p.step for p in stored],
                "values": [p.value for p in stored],
                "times": [p.time for p in stored],
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
    stmt = upsert_insert(session, MetricPoint)
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "name", "step"],
        set_={
            "value": stmt.excluded.value,
            "attempt": stmt.excluded.attempt,
            "time": stmt.excluded.time,
        },
    )
    session.execute(stmt, rows)


# The summary in one statement: the UPDATE locks the row and computes from its latest version,
# so the nodes of a gang ingesting into one job at once lose nothing (`_update_latest`).
_PG_LATEST = text(
    "UPDATE jobs SET"
    " latest_metrics = coalesce(latest_metrics, '{}'::jsonb) || CAST(:latest AS jsonb),"
    " current_step = greatest(coalesce(current_step, 0), :step),"
    " best_loss = least(best_loss, :best_loss),"  # least() skips NULLs
    " best_eval_loss = least(best_eval_loss, :best_eval_loss),"
    " updated_at = :now"
    " WHERE id = :job_id"
)
_SUMMARY = ("latest_metrics", "current_step", "best_loss", "best_eval_loss", "updated_at")


def _update_latest(session: Session, job_id: int, points: Sequence[Metric]) -> None:
    """The job row's summary of `points`: the latest value of each series, `current_step`
    (never lowered), the best losses. Two nodes of a gang ingest into one job at once (each
    its ranks' `sys/*` series), and two unlocked read-modify-writes lost an update (a gang
    that ended at step 16 showed step 13): on Postgres one UPDATE computes the summary from the
    row it has locked (a `Job` of the session has those attributes expired), elsewhere the row
    is read locked (`FOR UPDATE`) first."""
    if session.get_bind().dialect.name == "postgresql":
        last = {p.name: p.value for p in points}
        values = {
            "job_id": job_id,
            "latest": json.dumps({n: v if math.isfinite(v) else None for n, v in last.items()}),
            "step": max(p.step for p in points),
            "best_loss": _lowest(None, points, "loss"),
            "best_eval_loss": _lowest(None, points, "eval_loss"),
            "now": utcnow(),
        }
        session.execute(_PG_LATEST, values)
        if (loaded := session.identity_map.get(identity_key(Job, job_id))) is not None:
            session.expire(loaded, _SUMMARY)
        return
    job = session.get(Job, job_id, with_for_update=True, populate_existing=True)
    if job is not None:
        latest = dict(job.latest_metrics or {})
        # JSON has no NaN/inf; the series keeps the true value, the summary says null.
        last = {p.name: p.value for p in points}
        latest.update((n, v if math.isfinite(v) else None) for n, v in last.items())
        step = max(p.step for p in points)
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                latest_metrics=latest,
                current_step=max(step, job.current_step or 0),
                best_loss=_lowest(job.best_loss, points, "loss"),
                best_eval_loss=_lowest(job.best_eval_loss, points, "eval_loss"),
                updated_at=utcnow(),
            )
            .execution_options(synchronize_session="fetch")
        )


def _lowest(best: float | None, points: Sequence[Metric], name: str) -> float | None:
    """The lower of `best` and the finite values of series `name` in `points`."""
    values = [p.value for p in points if p.name == name and math.isfinite(p.value)]
    if best is not None:
        values.append(best)
    return min(values) if values else None


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
    stmt = upsert_insert(session, LogLine).on_conflict_do_nothing(
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
) -> Checkpoint | None:
    """Record a complete checkpoint; returns its row, or None when it was already recorded.
    No commit."""
    stmt = (
        upsert_insert(session, Checkpoint)
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
    new = result.first()
    return None if new is None else session.get(Checkpoint, new[0])
