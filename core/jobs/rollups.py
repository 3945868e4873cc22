"""Bucket extremes of one series on Postgres, from `metric_rollups` where a level fits.

`core.jobs.downsample.grid` puts bucket edges on rollup block edges, so the minimum and maximum of a
bucket are those of its whole blocks (rows of `metric_rollups`, kept exact by the trigger of
migration 0004) and, for the two blocks cut by the ends of the requested range, of the points
inside the range. A 1,000,000-point series cut to 1,000 points reads ~2,000-8,000 rollup rows
and at most two blocks of points instead of the whole series.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

from core.jobs.downsample import Grid

# Min/max per bucket in one pass: arrays compare element-wise, so min(ARRAY[value, step]) is
# the bucket's minimum with its (earliest) step, max(ARRAY[value, -step]) its maximum.
_FROM_POINTS = text(
    "SELECT min(ARRAY[value, step::float8]), max(ARRAY[value, -step::float8])"
    " FROM metric_points WHERE job_id = :job AND name = :name AND step BETWEEN :lo AND :hi"
    " GROUP BY (step::bigint - :base) / :width"
)

_FROM_ROLLUPS = text(
    "SELECT min(ARRAY[lv, ls]), max(ARRAY[hv, -hs]) FROM ("
    " SELECT min_value AS lv, min_step::float8 AS ls, max_value AS hv, max_step::float8 AS hs,"
    "  bucket::bigint << :shift AS at"
    " FROM metric_rollups WHERE job_id = :job AND name = :name AND level = :level"
    "  AND bucket > :b_lo AND bucket < :b_hi"
    " UNION ALL"
    " SELECT value, step::float8, value, step::float8, step::bigint"
    " FROM metric_points WHERE job_id = :job AND name = :name"
    "  AND (step BETWEEN :lo AND :lo_edge OR step BETWEEN :hi_edge AND :hi)"
    ") AS parts GROUP BY (at - :base) / :width"
)


def bucket_extremes(
    *, session: Session, job_id: int, name: str, lo: int, hi: int, cut: Grid
) -> dict[int, float]:
    """{step: value} of the minimum and maximum point of every bucket of `cut` among the points
    of series `name` with `lo <= step <= hi`. Postgres only (reads `metric_rollups`)."""
    params: dict[str, int | str] = {
        "job": job_id, "name": name, "lo": lo, "hi": hi, "base": cut.base, "width": cut.width,
    }  # fmt: skip
    if cut.level == 0:
        query = _FROM_POINTS
        # JIT compilation costs more than it saves on this one-pass aggregate.
        session.execute(text("SET LOCAL jit = off"))
    else:
        b_lo, b_hi = lo >> cut.shift, hi >> cut.shift
        params |= {
            "level": cut.level,
            "shift": cut.shift,
            "b_lo": b_lo,
            "b_hi": b_hi,
            "lo_edge": min(hi, ((b_lo + 1) << cut.shift) - 1),
            "hi_edge": max(lo, b_hi << cut.shift),
        }
        query = _FROM_ROLLUPS
    points: dict[int, float] = {}
    for low, high in session.execute(query, params):
        points[int(low[1])] = float(low[0])
        points[int(-high[1])] = float(high[0])
    return points
