"""How long a job has trained and how long it has left, across pauses and restarts.

A job's attempts end and start again (pause/resume, a restart after a failure, preemption), so
neither figure may count from the latest attempt's start (issue 15). `jobs.runtime_s` holds the
seconds every ended attempt trained (added when each attempt ends, `core.attempts.apply`); a
running attempt adds its own wall time so far.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from core.models import TERMINAL_STATES, Job, JobState

# States in which an attempt's trainer runs, so its wall time so far counts.
LIVE = frozenset({JobState.RUNNING, JobState.PAUSING, JobState.PREEMPTING, JobState.CANCELLING})


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def running_seconds(job: Job, *, now: datetime | None = None) -> float | None:
    """Seconds the job has trained, all attempts together (to `now` while it runs); None
    before its first attempt started."""
    ended = float(job.runtime_s or 0.0)
    if job.state in LIVE and job.started_at is not None:
        now = now or datetime.now(UTC)
        return ended + max(0.0, (now - _aware(job.started_at)).total_seconds())
    if job.started_at is None and ended == 0.0:
        return None
    return ended


def eta_seconds(job: Job, *, now: datetime | None = None) -> float | None:
    """Seconds left for a running or paused job with a known `max_steps`; None otherwise.

    The rate is the trainer's recent step time (`latest_metrics["step_time_s"]`, a window of
    its last steps) when reported, else the run's average seconds per step over all attempts
    (`running_seconds / current_step`), so a pause or a restart does not restart the estimate.
    """
    if job.state in TERMINAL_STATES or not job.max_steps or not job.current_step:
        return None
    remaining = job.max_steps - job.current_step
    if remaining <= 0:
        return None
    metrics: dict[str, Any] = job.latest_metrics or {}
    step_time = metrics.get("step_time_s")
    if isinstance(step_time, int | float) and step_time > 0:
        return remaining * float(step_time)
    ran = running_seconds(job, now=now)
    if not ran:
        return None
    return remaining * ran / job.current_step
