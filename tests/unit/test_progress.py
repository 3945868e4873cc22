"""Step progress, the derived hang timeout and straggler detection: pure, table-driven."""

from __future__ import annotations

import pytest

from workers.progress import StepProgress, Straggler, StragglerDetector
from workers.watchdog import hang_timeout_s

FLOOR = 300.0


@pytest.mark.parametrize(
    ("configured", "median_gap", "expected"),
    [
        (6.0, None, 6.0),  # configured wins, before any median
        (6.0, 100.0, 6.0),  # configured wins over a slow job's pace too
        (None, None, FLOOR),  # no median yet: the floor
        (None, 2.0, FLOOR),  # 10 x 2 s is under the floor
        (None, 45.0, 450.0),  # 10 x the median over the floor
    ],
)
def test_hang_timeout_is_configured_else_ten_median_gaps_at_least_the_floor(
    configured: float | None, median_gap: float | None, expected: float
) -> None:
    assert hang_timeout_s(configured, median_gap, FLOOR) == expected


def test_progress_starts_at_the_first_step_and_medians_the_gaps_between_reports() -> None:
    p = StepProgress()
    assert p.observed_at is None and p.median_gap_s() is None  # setup: no clock running
    p.observe([(1, 100.0)], now=5.0)
    assert (p.step, p.observed_at) == (1, 5.0)
    p.observe([(1, 100.5), (2, 102.0), (3, 103.0)], now=6.0)  # eval at step 1: same step
    assert p.median_gap_s() is None  # 2 gaps: too few
    p.observe([(4, 110.0)], now=7.0)
    assert p.step == 4 and p.observed_at == 7.0
    assert p.median_gap_s() == 2.0  # gaps 2, 1, 7


def test_progress_ignores_lines_read_again_and_forgets_on_an_in_place_restart() -> None:
    p = StepProgress()
    p.observe([(1, 100.0), (2, 101.0)], now=5.0)
    p.observe([(1, 100.0), (2, 101.0)], now=9.0)  # re-read after a failed DB write
    assert p.observed_at == 5.0
    p.restarted()
    assert p.step is None and p.observed_at is None  # the restarted ranks' setup is no hang
    p.observe([(1, 150.0)], now=20.0)  # the replay from the checkpoint is progress
    assert (p.step, p.observed_at) == (1, 20.0)


def _run(detector: StragglerDetector, reports: list[list[float]]) -> list[list[int]]:
    return [[s.rank for s in detector.observe(step, r)] for step, r in enumerate(reports, 1)]


@pytest.mark.parametrize(
    ("reports", "flagged"),
    [
        # rank 2 at 2x the median three reports in a row: flagged at the third, once
        ([[1, 1, 2, 1]] * 5, [[], [], [2], [], []]),
        # 1.5x exactly is not slower than 1.5x the median
        ([[1, 1, 1.5, 1]] * 4, [[], [], [], []]),
        # a recovery in between restarts the count
        (
            [[1, 1, 2, 1], [1, 1, 2, 1], [1, 1, 1, 1], [1, 1, 2, 1], [1, 1, 2, 1], [1, 1, 2, 1]],
            [[], [], [], [], [], [2]],
        ),
        # flagged, recovered, slow again: flagged again; of two ranks, over 1.5x the other
        ([[1, 3]] * 3 + [[1, 1]] + [[1, 3]] * 3, [[], [], [1], [], [], [], [1]]),
        ([[1, 1.6]] * 3, [[], [], [1]]),
        ([[1, 1, 3]] * 3 + [[1, 1, 1]] + [[1, 1, 3]] * 3, [[], [], [2], [], [], [], [2]]),
        # two stragglers of four ranks
        ([[1, 3, 1, 3.1]] * 3, [[], [], [1, 3]]),  # each one's others: median 1
        ([[1, 4, 1, 1, 4.1]] * 3, [[], [], [1, 4]]),
        ([[1, 1, 1.4, 2]] * 3, [[], [], [3]]),  # 1.4 <= 1.5 x median(1, 1, 2): not flagged
        # one rank: nothing to compare with
        ([[5]] * 4, [[], [], [], []]),
    ],
)
def test_a_rank_over_one_and_a_half_medians_for_three_reports_is_flagged_once_until_it_recovers(
    reports: list[list[float]], flagged: list[list[int]]
) -> None:
    assert _run(StragglerDetector(), reports) == flagged


def test_a_straggler_names_its_time_the_median_and_ratio_and_repeated_steps_are_ignored() -> None:
    d = StragglerDetector()
    assert d.observe(10, [0.1, 0.1, 0.3]) == []
    assert d.observe(10, [0.1, 0.1, 0.3]) == []  # the same report read again
    assert d.observe(20, [0.1, 0.1, 0.3]) == []
    (found,) = d.observe(30, [0.1, 0.1, 0.3])
    assert found == Straggler(rank=2, step=30, seconds=0.3, median_s=0.1, reports=3)
    assert found.ratio == pytest.approx(3.0)


def test_a_detector_refuses_a_ratio_that_flags_everyone() -> None:
    with pytest.raises(ValueError, match="ratio"):
        StragglerDetector(ratio=1.0)
