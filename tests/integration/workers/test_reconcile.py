"""The reconciler re-sends queued jobs whose message was lost and reaps jobs of dead workers."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from celery import Celery
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from core import jobs
from core.db import session_factory
from core.models import Job, JobState, utcnow
from core.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    Worker,
    create_job,
    group_gone,
    job_events,
    job_row,
    launches,
    send,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
)
from workers.reconcile import Report, reconcile

LONG = {"train": {"max_steps": 100_000}, "checkpoint": {"interval_steps": 100_000}}


@pytest.fixture
def run_reconcile(
    settings: Settings, engine: Engine, celery_client: Celery
) -> Callable[..., Report]:
    """The reconciler over the given pools only (other tests' jobs share the database)."""

    def run(*pools: str, redispatch_after_s: float = 60.0, now: datetime | None = None) -> Report:
        return reconcile(
            settings=settings,
            session_factory=session_factory(engine),
            dispatch=lambda job_id, queue: send(celery_client, job_id, queue),
            redispatch_after_s=redispatch_after_s,
            pools=list(pools),
            now=now,
        )

    return run


def _cancel_and_wait(engine: Engine, job_id: int, worker: Worker) -> None:
    with Session(engine) as s:
        jobs.cancel(session=s, job_id=job_id)
        s.commit()
    assert wait_state(engine, job_id, ("cancelled",), 30, worker).state == "cancelled"
    for launch in launches(job_events(engine, job_id)):
        wait_for("the trainer to be gone", lambda p=launch.data["pgid"]: group_gone(p), 5)


def _as_if_running_on_a_dead_worker(
    engine: Engine, job_id: int, silence_s: float, *, cancelling: bool = False
) -> None:
    with Session(engine) as s:
        assert jobs.claim(session=s, job_id=job_id, worker="ghost@gone") is not None
        jobs.transition(session=s, job_id=job_id, to=JobState.RUNNING)
        if cancelling:
            jobs.cancel(session=s, job_id=job_id)
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(heartbeat_at=utcnow() - timedelta(seconds=silence_s))
        )
        s.commit()


def test_a_queued_job_without_a_message_is_sent_again_and_runs(
    engine: Engine,
    project: ProjectKey,
    dataset_id: str,
    worker: Worker,
    run_reconcile: Callable[..., Report],
) -> None:
    job_id = create_job(
        engine, project, tiny_spec(pool=worker.queue, dataset_id=dataset_id, **LONG)
    )
    # Never sent: as if the broker lost the message.
    assert run_reconcile(worker.queue, redispatch_after_s=60).redispatched == []
    assert run_reconcile(worker.queue, redispatch_after_s=0).redispatched == [job_id]
    # Once per period: the job counts as fresh again after a re-send.
    assert run_reconcile(worker.queue, redispatch_after_s=60).redispatched == []

    job = wait_state(engine, job_id, ("starting", "running"), 30, worker)
    assert job.attempt == 1 and job.worker == worker.name
    _cancel_and_wait(engine, job_id, worker)


def test_reaper_fails_or_cancels_jobs_whose_worker_stopped_heartbeating(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset_id: str,
    run_reconcile: Callable[..., Report],
) -> None:
    pool = unique_queue("noworker")
    spec = tiny_spec(pool=pool, dataset_id=dataset_id)
    lost, lost_cancelling, alive = (create_job(engine, project, spec) for _ in range(3))
    silence = 2 * settings.heartbeat_timeout_s
    _as_if_running_on_a_dead_worker(engine, lost, silence)
    _as_if_running_on_a_dead_worker(engine, lost_cancelling, silence, cancelling=True)
    _as_if_running_on_a_dead_worker(engine, alive, settings.heartbeat_timeout_s / 2)

    report = run_reconcile(pool)
    assert (report.failed, report.cancelled, report.requeued) == ([lost], [lost_cancelling], [])

    failed = job_row(engine, lost)
    assert failed.state == "failed" and failed.finished_at is not None
    match = re.fullmatch(r"worker lost \(no heartbeat for (\d+) s\)", failed.error or "")
    assert match and int(match[1]) >= silence
    assert job_row(engine, lost_cancelling).state == "cancelled"
    assert job_row(engine, alive).state == "running"
    assert run_reconcile(pool) == Report()  # nothing left to do

    with Session(engine) as s:  # no worker will ever end it
        jobs.transition(session=s, job_id=alive, to=JobState.FAILED, message="test cleanup")
        s.commit()


def test_reaper_requeues_a_lost_job_that_may_restart_and_a_worker_resumes_it(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset_id: str,
    worker: Worker,
    run_reconcile: Callable[..., Report],
) -> None:
    spec = tiny_spec(pool=worker.queue, dataset_id=dataset_id, retries={"max_restarts": 1}, **LONG)
    job_id = create_job(engine, project, spec)
    _as_if_running_on_a_dead_worker(engine, job_id, 2 * settings.heartbeat_timeout_s)

    assert run_reconcile(worker.queue).requeued == [job_id]
    restarting = [e for e in job_events(engine, job_id) if e.state_to == "restarting"]
    assert len(restarting) == 1 and restarting[0].data["cause"] == "failure"
    assert restarting[0].message.startswith("worker lost (no heartbeat for")

    job = wait_state(engine, job_id, ("starting", "running"), 30, worker)
    assert job.attempt == 2 and job.worker == worker.name
    _cancel_and_wait(engine, job_id, worker)


def test_a_live_worker_whose_job_was_reaped_stops_its_trainer(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset_id: str,
    worker: Worker,
    celery_client: Celery,
    run_reconcile: Callable[..., Report],
) -> None:
    """Fencing: after a reap (e.g. a network partition outlasting the heartbeat timeout) the
    attempt is no longer the worker's, and the worker must not train on beside a successor."""
    spec = tiny_spec(pool=worker.queue, dataset_id=dataset_id, **LONG)
    job_id = create_job(engine, project, spec)
    send(celery_client, job_id, worker.queue)
    wait_state(engine, job_id, ("running",), 60, worker)
    (launch,) = launches(job_events(engine, job_id))

    later = utcnow() + timedelta(seconds=2 * settings.heartbeat_timeout_s)
    # The reaper skips a row the worker holds locked at that instant (its next period takes
    # it), so run periods until it reaps, as beat would.
    wait_for(
        "the reaper to fail the silent job",
        lambda: run_reconcile(worker.queue, now=later).failed == [job_id],
        20,
    )
    wait_for("the reaped job's trainer to stop", lambda: group_gone(launch.data["pgid"]), 20)
    wait_for(
        "the worker to give the job up",
        lambda: f"job {job_id}: stopping the trainer (lost)" in worker.log,
        5,
    )
    job = job_row(engine, job_id)
    assert job.state == "failed" and (job.error or "").startswith("worker lost")
