"""`running_s` and `eta_s` count the whole run, not the latest attempt (issue 15)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.jobs.runtime import eta_seconds, running_seconds
from core.platform.tables import Job, JobState

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def job(**values: object) -> Job:
    row = Job(name="j", max_steps=100, runtime_s=0.0, latest_metrics={})
    for name, value in values.items():
        setattr(row, name, value)
    return row


def test_running_counts_ended_attempts_plus_the_live_one() -> None:
    # 300 s trained before a pause; the resumed attempt started 60 s ago.
    resumed = job(state=JobState.RUNNING, runtime_s=300.0, started_at=NOW - timedelta(seconds=60))
    assert running_seconds(resumed, now=NOW) == pytest.approx(360.0)


def test_a_paused_job_keeps_its_trained_time_and_stops_the_clock() -> None:
    paused = job(state=JobState.PAUSED, runtime_s=300.0, started_at=NOW - timedelta(hours=5))
    assert running_seconds(paused, now=NOW) == 300.0
    assert running_seconds(paused, now=NOW + timedelta(hours=1)) == 300.0


def test_a_job_that_never_ran_has_no_running_time() -> None:
    assert running_seconds(job(state=JobState.QUEUED), now=NOW) is None


def test_eta_uses_the_recent_step_time_when_reported() -> None:
    running = job(
        state=JobState.RUNNING,
        current_step=60,
        runtime_s=1000.0,
        started_at=NOW - timedelta(seconds=10),
        latest_metrics={"step_time_s": 0.5},
    )
    assert eta_seconds(running, now=NOW) == pytest.approx(40 * 0.5)


def test_eta_after_a_resume_averages_over_all_attempts_not_the_latest() -> None:
    # 50 steps in 500 s before the pause; the new attempt ran 10 s and reached step 51. From the
    # new attempt alone the rate would be 51 steps / 10 s; over the run it is 510 s / 51 steps.
    resumed = job(
        state=JobState.RUNNING,
        current_step=51,
        runtime_s=500.0,
        started_at=NOW - timedelta(seconds=10),
    )
    assert eta_seconds(resumed, now=NOW) == pytest.approx(49 * 510.0 / 51)


@pytest.mark.parametrize(
    ("state", "step", "max_steps"),
    [(JobState.SUCCEEDED, 50, 100), (JobState.RUNNING, None, 100), (JobState.RUNNING, 5, 0)],
)
def test_no_eta_when_it_cannot_be_known(state: JobState, step: int | None, max_steps: int) -> None:
    row = job(state=state, current_step=step, max_steps=max_steps, runtime_s=10.0)
    assert eta_seconds(row, now=NOW) is None
