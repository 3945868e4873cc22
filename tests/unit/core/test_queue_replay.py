"""The queue replay (core.scheduling.queue_forecast) on plain data: claim order with backfill, fair
share, quotas, gangs on distinct workers, and start times from the running jobs' releases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from core.platform.tables import Quota
from core.scheduling.queue_forecast import Queued, Release, replay
from core.scheduling.quotas import Standing, Use

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def _standings(*projects: str, **rows: Quota) -> dict[str, Standing]:
    return {
        p: Standing(project_id=p, pool="gpu", rows=[rows[p]] if p in rows else []) for p in projects
    }


def test_backfill_then_releases_then_the_order_without_devices() -> None:
    big = Queued(id=1, project_id="a", priority=5, slots=2, size=2)
    small = Queued(id=2, project_id="a", priority=0, slots=1, size=1)
    theirs = Queued(id=3, project_id="b", priority=0, slots=1, size=1)
    release = Release(NOW + timedelta(seconds=60), "b", 2, (("w2", 2),))
    order, starts = replay(
        [big, small, theirs], _standings("a", "b"), {"w1": 1, "w2": 0}, [release], NOW, {1, 2, 3}
    )
    # The big head does not fit w1: the small job behind it backfills; then project b (no
    # slots held) goes first once w2 frees 2; the big job never fits one worker again.
    assert order == [2, 3, 1]
    assert starts == {2: NOW, 3: NOW + timedelta(seconds=60)}


def test_a_quota_holds_a_project_back_until_its_own_job_ends() -> None:
    quota = Quota(project_id="a", pool="gpu", max_slots=1, weight=1.0)
    standings = _standings("a", **{"a": quota})
    standings["a"].use_pool, standings["a"].use_all = Use(slots=1, jobs=1), Use(slots=1, jobs=1)
    assert standings["a"].blocked() == "quota gpus 1/1"
    waiting = Queued(id=4, project_id="a", priority=0, slots=1, size=1)
    ends = Release(NOW + timedelta(seconds=30), "a", 1, (("w1", 1),))
    order, starts = replay([waiting], standings, {"w1": 3}, [ends], NOW, {4})
    assert order == [4] and starts == {4: NOW + timedelta(seconds=30)}


def test_a_gang_needs_as_many_workers_as_nodes() -> None:
    gang = Queued(id=5, project_id="a", priority=0, slots=2, size=4)  # 2 nodes x 2
    order, starts = replay([gang], _standings("a"), {"w1": 4, "w2": 1}, [], NOW, {5})
    assert order == [5] and starts == {}  # one worker with 4 free is not two nodes
    order, starts = replay([gang], _standings("a"), {"w1": 2, "w2": 2}, [], NOW, {5})
    assert starts == {5: NOW}
