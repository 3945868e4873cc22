"""Priorities hold whatever order the broker delivers in; cancel works in every non-terminal
state and leaves no process behind.

The jobs are `STEPS_PY` programs under real torchrun: what is tested is the queue, the claim and
the process groups, not what trains (a built-in trainer cost each job ~6 CPU-s of imports)."""

from __future__ import annotations

import time

from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from tests.conftest import ProjectKey
from tests.integration.workers.archives import UNTIL_STOPPED, steps_spec
from tests.integration.workers.helpers import (
    Worker,
    create_job,
    group_gone,
    job_events,
    job_row,
    launches,
    send,
    submit,
    wait_for,
    wait_state,
)
from tests.support.figures import bound, record

GONE_WITHIN_S = 10.0


def _cancel(engine: Engine, job_id: int) -> str:
    with Session(engine) as s:
        state = jobs.cancel(session=s, job_id=job_id).state
        s.commit()
        return state


def _cancelled_and_gone(engine: Engine, job_id: int, worker: Worker) -> None:
    """State cancelled and every trainer process gone, within `bound(GONE_WITHIN_S)` of the
    cancel; how long it took is a figure against GONE_WITHIN_S (`tests.support.figures`)."""
    started, limit = time.monotonic(), bound(GONE_WITHIN_S)
    assert wait_state(engine, job_id, ("cancelled",), limit, worker).state == "cancelled"
    for launch in launches(job_events(engine, job_id)):
        left = max(0.1, limit - (time.monotonic() - started))
        wait_for(
            "the trainer's processes to be gone", lambda p=launch.data["pgid"]: group_gone(p), left
        )
    record("cancel -> cancelled, processes gone", time.monotonic() - started, GONE_WITHIN_S)


def test_a_higher_priority_job_queued_later_runs_first(
    engine: Engine, celery_client: Celery, project: ProjectKey, steps_code: str, worker: Worker
) -> None:
    busy_spec = steps_spec(steps_code, pool=worker.queue, steps=UNTIL_STOPPED)
    busy = submit(engine, celery_client, project, busy_spec)
    wait_state(engine, busy, ("running",), 60, worker)

    def submit_at(priority: int) -> int:
        spec = steps_spec(steps_code, pool=worker.queue, steps=2, priority=priority)
        return submit(engine, celery_client, project, spec)

    try:
        low = submit_at(-1)
        high = submit_at(10)  # its message is behind the low one's in the broker
    finally:
        _cancel(engine, busy)
    first = wait_state(engine, high, ("succeeded",), 90, worker)
    second = wait_state(engine, low, ("succeeded",), 90, worker)
    assert first.started_at is not None and second.started_at is not None
    assert first.started_at < second.started_at
    # The low job's message was the one that started the high job.
    assert f"job {high}: claimed attempt 1 by {worker.name} (first in pool" in worker.log


def test_cancel_in_every_non_terminal_state_ends_it_and_its_processes(
    engine: Engine, celery_client: Celery, project: ProjectKey, steps_code: str, worker: Worker
) -> None:
    spec = steps_spec(steps_code, pool=worker.queue, steps=UNTIL_STOPPED)

    queued = create_job(engine, project, spec)  # never sent: stays queued
    assert _cancel(engine, queued) == "cancelled"
    send(celery_client, queued, worker.queue)  # a late message starts nothing

    starting = submit(engine, celery_client, project, spec)
    wait_for("the claim", lambda: job_row(engine, starting).state != "queued", 30, poll_s=0.02)
    assert _cancel(engine, starting) == "cancelling"  # still starting: torchrun just launched
    assert any(e.state_from == "starting" for e in job_events(engine, starting)
               if e.state_to == "cancelling")  # fmt: skip
    _cancelled_and_gone(engine, starting, worker)

    running = submit(engine, celery_client, project, spec)
    wait_state(engine, running, ("running",), 60, worker)
    assert _cancel(engine, running) == "cancelling"
    _cancelled_and_gone(engine, running, worker)

    paused = submit(engine, celery_client, project, spec)
    wait_state(engine, paused, ("running",), 60, worker)
    with Session(engine) as s:
        jobs.pause(session=s, job_id=paused)
        s.commit()
    wait_state(engine, paused, ("paused",), 30, worker)
    assert _cancel(engine, paused) == "cancelled"
    _cancelled_and_gone(engine, paused, worker)

    pausing = submit(engine, celery_client, project, spec)
    wait_state(engine, pausing, ("running",), 60, worker)
    with Session(engine) as s:
        assert jobs.pause(session=s, job_id=pausing).state == "pausing"
        s.commit()
    # Whether or not the worker has begun stopping the trainer for the pause, cancel wins.
    assert _cancel(engine, pausing) == "cancelling"
    assert any(e.state_from == "pausing" for e in job_events(engine, pausing)
               if e.state_to == "cancelling")  # fmt: skip
    _cancelled_and_gone(engine, pausing, worker)

    assert launches(job_events(engine, queued)) == []
    for job_id in (queued, starting, running, paused, pausing):
        job = job_row(engine, job_id)
        assert job.state == "cancelled" and job.finished_at is not None
