"""A worker stopped mid-job (SIGTERM, as a process manager does) orphans no trainer."""

from __future__ import annotations

import time
from pathlib import Path

from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core import jobs
from core.models import JobState
from core.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    create_job,
    group_gone,
    job_events,
    job_row,
    launches,
    metric_series,
    send,
    start_worker,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
)


def test_warm_shutdown_stops_the_trainer_and_hands_the_job_back(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    tmp_path: Path,
) -> None:
    worker = start_worker(  # the threads pool a worker runs in production
        settings=settings,
        client=celery_client,
        queue=unique_queue("stop"),
        log_dir=tmp_path,
        slots=2,
    )
    try:
        spec = tiny_spec(
            pool=worker.queue,
            dataset_id=dataset_id,
            train={"max_steps": 100_000},
            checkpoint={"interval_steps": 100_000},
        )
        job_id = create_job(engine, project, spec)
        send(celery_client, job_id, worker.queue)
        wait_state(engine, job_id, ("running",), 60, worker)
        wait_for("a first metric", lambda: metric_series(engine, job_id, "loss"), 30)
        (launch,) = launches(job_events(engine, job_id))

        stopped_at = time.monotonic()
        assert worker.stop(timeout_s=30) == 0, worker.log
        assert time.monotonic() - stopped_at < settings.cancel_grace_s + 10
        assert group_gone(launch.data["pgid"])
    finally:
        worker.stop(timeout_s=5)

    job = job_row(engine, job_id)
    assert (job.state, job.attempt) == ("queued", 1)
    events = job_events(engine, job_id)
    (handed_back,) = [e for e in events if e.state_to == "restarting"]
    assert handed_back.data["cause"] == "shutdown" and handed_back.data["attempt"] == 1
    # The trainer checkpointed on SIGTERM, so the next attempt resumes where this one stopped.
    assert [e.kind for e in events].count("checkpoint") == 1

    with Session(engine) as s:  # no worker serves this queue any more
        jobs.cancel(session=s, job_id=job_id)
        s.commit()


def test_a_killed_worker_takes_its_trainer_down_with_it(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    tmp_path: Path,
) -> None:
    worker = start_worker(  # the threads pool a worker runs in production
        settings=settings,
        client=celery_client,
        queue=unique_queue("kill"),
        log_dir=tmp_path,
        slots=2,
    )
    try:
        spec = tiny_spec(
            pool=worker.queue,
            dataset_id=dataset_id,
            train={"max_steps": 100_000},
            checkpoint={"interval_steps": 100_000},
            resources={"procs_per_node": 2},
        )
        job_id = create_job(engine, project, spec)
        send(celery_client, job_id, worker.queue)
        wait_state(engine, job_id, ("running",), 60, worker)
        (launch,) = launches(job_events(engine, job_id))

        worker.proc.kill()  # SIGKILL: no handler runs in the worker
        worker.proc.wait()
        # torchrun gets SIGTERM from the kernel (parent-death signal) and stops the ranks.
        wait_for("the orphaned trainer to stop", lambda: group_gone(launch.data["pgid"]), 30)
    finally:
        worker.stop(timeout_s=5)

    with Session(engine) as s:  # the reaper's business after heartbeat_timeout_s; end it here
        jobs.cancel(session=s, job_id=job_id)
        jobs.transition(session=s, job_id=job_id, to=JobState.CANCELLED, message="test cleanup")
        s.commit()
