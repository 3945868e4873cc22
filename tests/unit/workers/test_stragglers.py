"""`workers.watchers.pace.StragglerDetector` on made-up `rank_step_times` reports: what it flags
and what it lets pass (real processes: tests/integration/trainer/test_trainer_straggler.py)."""

from __future__ import annotations

import pytest

from workers.watchers.pace import STRAGGLER_RATIO, STRAGGLER_REPORTS, StragglerDetector


def feed(detector: StragglerDetector, reports: list[list[float]]) -> list[tuple[int, int]]:
    """(rank, step) of every straggler flagged, reports numbered as steps 5, 10, ..."""
    return [
        (s.rank, s.step)
        for i, seconds in enumerate(reports)
        for s in detector.observe(5 * (i + 1), seconds)
    ]


def test_a_rank_over_the_ratio_in_consecutive_reports_is_flagged_once_at_the_last() -> None:
    slow = [0.10, 0.10, 0.10, 0.10 * STRAGGLER_RATIO * 1.2]
    flagged = feed(StragglerDetector(), [slow] * (STRAGGLER_REPORTS + 2))
    assert flagged == [(3, 5 * STRAGGLER_REPORTS)]


def test_spikes_shorter_than_the_streak_are_not_flagged() -> None:
    even, spike = [0.1, 0.1], [0.1, 0.1 * STRAGGLER_RATIO * 2]
    reports = ([spike] * (STRAGGLER_REPORTS - 1) + [even]) * 4
    assert feed(StragglerDetector(), reports) == []


def test_a_rank_at_exactly_the_ratio_is_not_a_straggler() -> None:
    assert feed(StragglerDetector(), [[0.2, 0.2 * STRAGGLER_RATIO]] * 10) == []


def test_a_recovered_rank_is_flagged_again_when_it_slows_again() -> None:
    slow, even = [0.1, 0.4], [0.1, 0.1]
    reports = [slow] * STRAGGLER_REPORTS + [even] + [slow] * STRAGGLER_REPORTS
    assert feed(StragglerDetector(), reports) == [
        (1, 5 * STRAGGLER_REPORTS),
        (1, 5 * (2 * STRAGGLER_REPORTS + 1)),
    ]


def test_the_median_is_of_the_other_ranks_so_one_of_two_at_2x_is_flagged() -> None:
    # with the median of all ranks, 0.2 vs median 0.15 would be 1.33x and never flagged
    assert feed(StragglerDetector(), [[0.1, 0.2]] * STRAGGLER_REPORTS) == [
        (1, 5 * STRAGGLER_REPORTS)
    ]


def test_a_report_read_again_or_of_one_rank_is_ignored() -> None:
    detector = StragglerDetector(reports=2)
    assert detector.observe(5, [0.1, 0.4]) == []
    assert detector.observe(5, [0.1, 0.4]) == []  # the same line again: no second report
    assert detector.observe(3, [0.1, 0.4]) == []  # an earlier step (a replay)
    assert detector.observe(10, [0.4]) == []  # one rank: nobody to compare with
    assert [s.rank for s in detector.observe(15, [0.1, 0.4])] == [1]


@pytest.mark.parametrize(("ratio", "reports"), [(1.0, 3), (0.5, 3), (1.5, 0)])
def test_a_ratio_not_over_one_or_no_reports_is_refused(ratio: float, reports: int) -> None:
    with pytest.raises(ValueError, match="ratio must be > 1"):
        StragglerDetector(ratio=ratio, reports=reports)
