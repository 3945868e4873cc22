"""A worker stopped mid-job (SIGTERM, as a process manager does) orphans no trainer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.settings import Settings
from core.platform.tables import JobState
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    UNTIL_STOPPED,
    Worker,
    group_gone,
    job_events,
    job_row,
    running_launch,
    start_worker,
    submit,
    tiny_spec,
    unique_queue,
    wait_for,
)


@pytest.fixture
def worker(settings: Settings, celery_client: Celery, tmp_path: Path) -> Iterator[Worker]:
    """A worker with 2 CPU slots on the threads pool, as a worker runs in production."""
    w = start_worker(
        settings=settings,
        client=celery_client,
        queue=unique_queue("shutdown"),
        log_dir=tmp_path,
        slots=2,
    )
    yield w
    w.stop(timeout_s=5)


def test_warm_shutdown_stops_the_trainer_and_hands_the_job_back(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    worker: Worker,
) -> None:
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        **UNTIL_STOPPED,
    )
    job_id = submit(engine, celery_client, project, spec)
    launch = running_launch(engine, job_id, worker)

    stopped_at = time.monotonic()
    assert worker.stop(timeout_s=30) == 0, worker.log
    assert time.monotonic() - stopped_at < settings.cancel_grace_s + 10
    assert group_gone(launch.data["pgid"])

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
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    worker: Worker,
) -> None:
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        **UNTIL_STOPPED,
        resources={"procs_per_node": 2},
    )
    job_id = submit(engine, celery_client, project, spec)
    launch = running_launch(engine, job_id, worker, first_metric=False)

    worker.proc.kill()  # SIGKILL: no handler runs in the worker
    worker.proc.wait()
    # torchrun gets SIGTERM from the kernel (parent-death signal) and stops the ranks.
    wait_for("the orphaned trainer to stop", lambda: group_gone(launch.data["pgid"]), 30)

    with Session(engine) as s:  # the reaper's business after heartbeat_timeout_s; end it here
        jobs.cancel(session=s, job_id=job_id)
        jobs.transition(session=s, job_id=job_id, to=JobState.CANCELLED, message="test cleanup")
        s.commit()
