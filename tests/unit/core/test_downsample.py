"""core.jobs.downsample: min/max buckets keep the shape of a series within max_points."""

from __future__ import annotations

import math
import random

import pytest

from core.jobs.downsample import (
    LEVEL_SHIFTS,
    MIN_BLOCKS_PER_BUCKET,
    grid,
    min_max,
    num_buckets,
)


def _noisy(n: int, seed: int = 0) -> tuple[list[int], list[float]]:
    rng = random.Random(seed)
    steps = list(range(1, n + 1))
    return steps, [math.exp(-s / n) + rng.uniform(-0.05, 0.05) for s in steps]


@pytest.mark.parametrize("max_points", [1, 2, 3, 4, 7, 100, 1000])
def test_result_never_exceeds_max_points_and_keeps_the_exact_last_point(max_points: int) -> None:
    steps, values = _noisy(10_000)
    out_steps, out_values = min_max(steps, values, max_points)
    assert 1 <= len(out_steps) <= max_points
    assert (out_steps[-1], out_values[-1]) == (steps[-1], values[-1])
    assert out_steps == sorted(set(out_steps))
    stored = dict(zip(steps, values, strict=True))
    assert all(stored[s] == v for s, v in zip(out_steps, out_values, strict=True))


def test_a_single_step_spike_survives_and_the_envelope_is_kept() -> None:
    steps, values = _noisy(100_000)
    values[31_337] = 50.0  # a loss spike of one step
    values[77_777] = -3.0  # and a dip
    out_steps, out_values = min_max(steps, values, 500)
    assert (31_338, 50.0) in zip(out_steps, out_values, strict=True)
    assert (77_778, -3.0) in zip(out_steps, out_values, strict=True)
    assert max(out_values) == max(values) and min(out_values) == min(values)
    # Every bucket-sized window of the raw series has its extremes in the result.
    assert out_steps[0] == steps[0]


def test_a_series_that_fits_comes_back_unchanged() -> None:
    steps, values = [0, 5, 9], [1.0, 2.0, 3.0]
    assert min_max(steps, values, 3) == (steps, values)


def test_sparse_and_nan_series_are_handled() -> None:
    steps = list(range(0, 1_000_000, 997))
    values = [float(s % 13) for s in steps]
    values[500] = math.nan
    out_steps, out_values = min_max(steps, values, 50)
    assert len(out_steps) <= 50
    assert any(math.isnan(v) for v in out_values)


def test_max_points_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        min_max([1], [1.0], 0)


@pytest.mark.parametrize(
    ("lo", "hi", "buckets"),
    [(0, 999_999, 499), (5, 20_004, 99), (123, 54_321, 149), (0, 100, 49), (70_000, 70_063, 1)],
)
def test_grid_puts_at_most_the_asked_buckets_on_rollup_block_edges(
    lo: int, hi: int, buckets: int
) -> None:
    cut = grid(lo, hi, buckets)
    block = 1 << cut.shift
    assert cut.base % block == 0 and cut.width % block == 0 and cut.base <= lo
    used = cut.bucket(hi) - cut.bucket(lo) + 1
    assert used <= buckets
    ideal = -(-(hi - lo + 1) // buckets)
    assert cut.width <= 1.25 * ideal + 1  # at least ~80% of the buckets asked for are used
    if cut.level:  # each bucket is whole blocks: at least MIN_BLOCKS_PER_BUCKET of them
        assert cut.width >= MIN_BLOCKS_PER_BUCKET * block
        assert cut.shift == LEVEL_SHIFTS[cut.level - 1]


def test_a_million_steps_to_a_thousand_points_reads_a_coarse_level() -> None:
    cut = grid(0, 999_999, num_buckets(1000))
    assert cut.level >= 3  # blocks of >= 256 steps: a few thousand rollup rows, not 1M points
