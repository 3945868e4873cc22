"""Slot-seconds cut at UTC midnight, CPU-seconds shared by wall time, and prices
(`core.usage.accounting`, `core.usage.report.check_max_cost`)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from core.platform.errors import InvalidInput
from core.usage.accounting import NodeUsage, cost, split_days
from core.usage.report import check_max_cost
from jobspec.job import parse_job_spec


def _at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, minute, tzinfo=UTC)


def _node(start: datetime, end: datetime | None, *, slots: int = 2, cpu: float = 0.0) -> NodeUsage:
    return NodeUsage(
        job_id=1,
        project_id="prj",
        pool="gpu",
        attempt=1,
        node_rank=0,
        slots=slots,
        started_at=start,
        ended_at=end,
        cpu_seconds=cpu,
    )


def test_an_interval_over_midnight_is_cut_at_utc_midnight() -> None:
    assert split_days(_at(24, 23), _at(25, 1, 30)) == [
        (date(2026, 11, 24), 3600.0),
        (date(2026, 11, 25), 5400.0),
    ]


def test_midnight_is_utc_whatever_the_offset_of_the_times() -> None:
    plus_two = timezone(timedelta(hours=2))
    start = datetime(2026, 11, 25, 1, 0, tzinfo=plus_two)  # 23:00 UTC on the 24th
    assert split_days(start, start + timedelta(hours=2)) == [
        (date(2026, 11, 24), 3600.0),
        (date(2026, 11, 25), 3600.0),
    ]


def test_an_interval_spanning_whole_days_gives_each_day_86400_seconds() -> None:
    parts = split_days(_at(1, 12), _at(4, 12))
    assert [seconds for _, seconds in parts] == [43200.0, 86400.0, 86400.0, 43200.0]


def test_an_empty_or_reversed_interval_has_no_days() -> None:
    assert split_days(_at(2, 5), _at(2, 5)) == []
    assert split_days(_at(2, 6), _at(2, 5)) == []


def test_a_node_over_midnight_gives_each_day_its_slot_and_cpu_share() -> None:
    node = _node(_at(24, 22), _at(25, 2), slots=4, cpu=1000.0)  # 2 h + 2 h
    days = node.by_day()
    assert [(d.day, d.slot_seconds, d.cpu_seconds) for d in days] == [
        (date(2026, 11, 24), 4 * 7200.0, 500.0),
        (date(2026, 11, 25), 4 * 7200.0, 500.0),
    ]


def test_a_window_keeps_only_its_part_of_a_node() -> None:
    node = _node(_at(24, 22), _at(25, 2), slots=1, cpu=400.0)
    assert node.slot_seconds(since=_at(25, 0), until=_at(25, 1)) == 3600.0
    (only,) = node.by_day(since=_at(25, 1), until=_at(26, 0))
    assert (only.day, only.slot_seconds, only.cpu_seconds) == (date(2026, 11, 25), 3600.0, 100.0)


def test_a_running_node_counts_up_to_now() -> None:
    node = _node(_at(25, 10), None, slots=2, cpu=60.0)
    assert node.slot_seconds(now=_at(25, 10, 30)) == 2 * 1800.0
    (today,) = node.by_day(now=_at(25, 10, 30))
    assert today.cpu_seconds == 60.0


def test_cost_is_slot_hours_times_the_pools_price_and_zero_without_one() -> None:
    prices = {"gpu": 2.5}
    assert cost(7200.0, "gpu", prices) == 5.0
    assert cost(7200.0, "cpu", prices) == 0.0


def _spec(**limits: float) -> object:
    return parse_job_spec(
        {
            "name": "t",
            "data": {"uri": "/tmp/x"},
            "resources": {"pool": "gpu"},
            "limits": limits,
        }
    )


def test_max_cost_needs_a_priced_pool() -> None:
    spec = _spec(max_cost=1.0)
    check_max_cost(spec, {"gpu": 1.0})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput) as refused:
        check_max_cost(spec, {"other": 1.0})  # type: ignore[arg-type]
    assert refused.value.details[0]["loc"] == ["body", "limits", "max_cost"]
    check_max_cost(_spec(), {})  # type: ignore[arg-type]  # no limit: any pool


def test_max_cost_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_cost"):
        _spec(max_cost=0)
