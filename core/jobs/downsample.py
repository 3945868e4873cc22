"""Shape-preserving downsampling of one metric series: min/max buckets over step ranges.

For a result of at most `max_points` points the series' steps `[lo, hi]` are cut into at most
`B = (max_points - 2) // 2` buckets of `width` steps each (`bucket = (step - base) // width`);
each bucket keeps the point holding its minimum value and the one holding its maximum (ties:
the earliest step), and the series' first and last points are always kept. So a spike of a
single step survives, the min/max envelope is exact at bucket resolution, and the result has at
most `max_points` points. This is the "min/max" (M4 without first/last per bucket) aggregation
of Jugel et al., "M4: A Visualization-Oriented Time Series Data Aggregation", VLDB 2014; unlike
LTTB (Steinarsson 2013) it is a pure GROUP BY, and it composes: the extremes of a bucket are
the extremes of the extremes of its parts.

That is what makes it fast on Postgres: `metric_rollups` (migration 0004) keeps each series'
extremes per aligned block of `1 << shift` steps (`LEVEL_SHIFTS`), and bucket edges are put on
block edges (`grid`), so a bucket is whole blocks plus, at the ends of the range, points.
A bucket spans at least 4 blocks of the level read, so at least ~80% of the `B` buckets are used
(`width` <= 1.25 x the ideal `span / B`). `core.jobs.reports` computes the same rule in SQL from the
rollups; this module is the portable path and the reference the SQL is tested against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Rollup block sizes, 16 to 1,048,576 steps: level `i` (1-based) has blocks of 1 << shift.
LEVEL_SHIFTS = (4, 6, 8, 10, 12, 14, 16, 18, 20)
MIN_BLOCKS_PER_BUCKET = 4


def num_buckets(max_points: int) -> int:
    """Buckets for a result of at most `max_points` points (2 per bucket + first + last)."""
    return max(0, (max_points - 2) // 2)


@dataclass(frozen=True, slots=True)
class Grid:
    """Buckets `(step - base) // width` for steps in `[lo, hi]`; `width` is a multiple of the
    block size `1 << shift` of rollup level `level` (0: points, shift 0), `base` a block edge."""

    level: int
    shift: int
    base: int
    width: int

    def bucket(self, step: int) -> int:
        return (step - self.base) // self.width


def grid(lo: int, hi: int, buckets: int) -> Grid:
    """The buckets (at most `buckets` >= 1) that cut the steps `[lo, hi]` (`lo <= hi`).

    The level is the coarsest whose blocks fit `MIN_BLOCKS_PER_BUCKET` times in the ideal width
    `ceil(span / buckets)`; the width is the ideal rounded up to whole blocks from `base`.
    """
    if buckets < 1 or hi < lo:
        raise ValueError("need buckets >= 1 and lo <= hi")
    ideal = -(-(hi - lo + 1) // buckets)
    level, shift = 0, 0
    for i, s in enumerate(LEVEL_SHIFTS, start=1):
        if MIN_BLOCKS_PER_BUCKET << s <= ideal:
            level, shift = i, s
    block = 1 << shift
    base = (lo >> shift) << shift
    width = block * -(-(hi - base + 1) // (block * buckets))
    return Grid(level=level, shift=shift, base=base, width=width)


def _key(value: float) -> float:
    # Postgres orders NaN above every number; keep the same order so both paths agree.
    return math.inf if math.isnan(value) else value


def min_max(
    steps: Sequence[int], values: Sequence[float], max_points: int
) -> tuple[list[int], list[float]]:
    """At most `max_points` (>= 1) points of the series `steps` (ascending) / `values`.

    Series that already fit come back unchanged. `max_points == 1` keeps only the last point.
    Raises ValueError for `max_points < 1`.
    """
    if max_points < 1:
        raise ValueError("max_points must be >= 1")
    n = len(steps)
    if n <= max_points:
        return list(steps), list(values)
    if max_points == 1:
        return [steps[-1]], [values[-1]]
    buckets = num_buckets(max_points)
    keep = {0, n - 1}
    if buckets:
        cut = grid(steps[0], steps[-1], buckets)
        best: dict[int, tuple[int, int]] = {}  # bucket -> (index of min, index of max)
        for i, (step, value) in enumerate(zip(steps, values, strict=True)):
            b = cut.bucket(step)
            cur = best.get(b)
            if cur is None:
                best[b] = (i, i)
                continue
            i_min, i_max = cur
            if _key(value) < _key(values[i_min]):
                i_min = i
            if _key(value) > _key(values[i_max]):
                i_max = i
            best[b] = (i_min, i_max)
        for i_min, i_max in best.values():
            keep.update((i_min, i_max))
    order = sorted(keep)
    return [steps[i] for i in order], [values[i] for i in order]
