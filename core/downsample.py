"""Shape-preserving downsampling of one metric series: min/max buckets over step ranges.

The step range `[lo, hi]` of the series is cut into `B = (max_points - 2) // 2` equal-width
buckets (`bucket = (step - lo) * B // (hi - lo + 1)`); each bucket keeps the point holding its
minimum value and the one holding its maximum (ties: the earliest step), and the series'
first and last points are always kept. So a spike of a single step survives, the min/max
envelope is exact at bucket resolution, and the result has at most `max_points` points.
This is the "min/max" (M4 without first/last per bucket) aggregation of Jugel et al.,
"M4: A Visualization-Oriented Time Series Data Aggregation", VLDB 2014; unlike LTTB
(Steinarsson 2013) it is a pure GROUP BY, so Postgres computes it in one pass
(`core.queries` runs the same rule in SQL; this module is the portable path and the
reference the SQL is tested against).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def num_buckets(max_points: int) -> int:
    """Buckets for a result of at most `max_points` points (2 per bucket + first + last)."""
    return max(0, (max_points - 2) // 2)


def bucket_of(step: int, *, lo: int, span: int, buckets: int) -> int:
    """Bucket index in `[0, buckets)` of `step`, for a series whose steps span `[lo, lo+span)`."""
    return (step - lo) * buckets // span


def _key(value: float) -> float:
    # Postgres orders NaN above every number; keep the same order so both paths agree.
    return math.inf if math.isnan(value) else value


def min_max(
    steps: Sequence[int], values: Sequence[float], max_points: int
) -> tuple[list[int], list[float]]:
    """At most `max_points` (>= 1) points of the series `steps` (ascending) / `values`.

    Series that already fit come back unchanged. `max_points == 1` keeps only the last point.
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
        lo, span = steps[0], steps[-1] - steps[0] + 1
        best: dict[int, tuple[int, int]] = {}  # bucket -> (index of min, index of max)
        for i, (step, value) in enumerate(zip(steps, values, strict=True)):
            b = bucket_of(step, lo=lo, span=span, buckets=buckets)
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
