"""How long a job has trained and how long it has left, across pauses and restarts.

A job's attempts end and start again (pause/resume, a restart after a failure, preemption), so
neither figure may count from the latest attempt's start (issue 15). `jobs.runtime_s` holds the
seconds every ended attempt trained (added when each attempt ends,
`core.attempts.lifecycle_apply.apply`); a running attempt adds its own wall time so far. The API
(`running_s`, `eta_s`), the queue's estimated starts
(`core.scheduling.queue_forecast`), the CLI and the dashboard all use these two functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from core.platform.tables import TERMINAL_STATES, Job, JobState, aware

# States in which an attempt's trainer runs, so its wall time so far counts.
LIVE = frozenset({JobState.RUNNING, JobState.PAUSING, JobState.PREEMPTING, JobState.CANCELLING})


def trained_seconds(
    *, state: str, runtime_s: float | None, started_at: datetime | None, now: datetime | None = None
) -> float | None:
    """Seconds trained, all attempts together: the ended attempts' `runtime_s` plus, while an
    attempt runs, its wall time since `started_at` (to `now`); None before the first attempt."""
    ended = float(runtime_s or 0.0)
    if state in LIVE and started_at is not None:
        now = now or datetime.now(UTC)
        return ended + max(0.0, (now - aware(started_at)).total_seconds())
    if started_at is None and ended == 0.0:
        return None
    return ended


def seconds_left(
    *,
    state: str,
    current_step: int | None,
    max_steps: int | None,
    runtime_s: float | None,
    started_at: datetime | None,
    latest_metrics: Mapping[str, Any] | None,
    now: datetime | None = None,
) -> float | None:
    """Seconds left for a job that has not ended and has a known `max_steps`; None otherwise.

    The rate is the trainer's recent step time (`latest_metrics["step_time_s"]`, a window of
    its last steps) when reported, else the run's average seconds per step over all attempts
    (`trained_seconds / current_step`), so a pause or a restart does not restart the estimate.
    """
    if state in TERMINAL_STATES or not max_steps or not current_step:
        return None
    remaining = max_steps - current_step
    if remaining <= 0:
        return None
    step_time = (latest_metrics or {}).get("step_time_s")
    if isinstance(step_time, int | float) and step_time > 0:
        return remaining * float(step_time)
    ran = trained_seconds(state=state, runtime_s=runtime_s, started_at=started_at, now=now)
    if not ran:
        return None
    return remaining * ran / current_step


def running_seconds(job: Job, *, now: datetime | None = None) -> float | None:
    """`trained_seconds` of a job row."""
    return trained_seconds(
        state=job.state, runtime_s=job.runtime_s, started_at=job.started_at, now=now
    )


def eta_seconds(job: Job, *, now: datetime | None = None) -> float | None:
    """`seconds_left` of a job row."""
    return seconds_left(
        state=job.state,
        current_step=job.current_step,
        max_steps=job.max_steps,
        runtime_s=job.runtime_s,
        started_at=job.started_at,
        latest_metrics=job.latest_metrics,
        now=now,
    )
