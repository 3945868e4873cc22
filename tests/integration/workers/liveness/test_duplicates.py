"""A job message delivered more than once starts exactly one trainer (claim-by-UPDATE fencing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.archives import steps_spec
from tests.integration.workers.helpers import (
    Worker,
    create_job,
    job_events,
    job_row,
    launches,
    send,
    start_worker,
    unique_queue,
    wait_for,
    wait_state,
)


@pytest.fixture(scope="module")
def two_workers(
    settings: Settings, celery_client: Celery, worker_logs: Path
) -> Iterator[tuple[Worker, Worker]]:
    """Two workers on the same queue, both idle and ready."""
    queue = unique_queue("dup")
    first = start_worker(settings=settings, client=celery_client, queue=queue, log_dir=worker_logs)
    try:
        second = start_worker(
            settings=settings, client=celery_client, queue=queue, log_dir=worker_logs
        )
    except BaseException:
        first.stop()
        raise
    yield first, second
    first.stop()
    second.stop()


def _deliveries(workers: tuple[Worker, ...], job_id: int) -> tuple[int, int]:
    """(claims, lost claims) of `job_id` in the workers' logs."""
    logs = "".join(w.log for w in workers)
    return logs.count(f"job {job_id}: claimed"), logs.count(f"job {job_id}: not claimed")


def test_a_message_sent_twice_to_two_idle_workers_starts_one_trainer(
    engine: Engine,
    celery_client: Celery,
    project: ProjectKey,
    steps_code: str,
    two_workers: tuple[Worker, Worker],
) -> None:
    queue = two_workers[0].queue
    spec = steps_spec(steps_code, pool=queue, steps=12)  # the claim is the subject, not training
    job_id = create_job(engine, project, spec)
    send(celery_client, job_id, queue)
    send(celery_client, job_id, queue)

    job = wait_state(engine, job_id, ("succeeded", "failed", "cancelled"), 90, two_workers[0])
    assert job.state == "succeeded", job.error
    # Both deliveries ran, concurrently on the two workers; exactly one won the claim.
    wait_for("both deliveries", lambda: sum(_deliveries(two_workers, job_id)) == 2, 30)
    assert _deliveries(two_workers, job_id) == (1, 1)
    assert _deliveries(two_workers[:1], job_id) in ((1, 0), (0, 1))  # one on each worker

    events = job_events(engine, job_id)
    claims = [e for e in events if (e.state_from, e.state_to) == ("queued", "starting")]
    assert job.attempt == 1 and len(claims) == 1 and len(launches(events)) == 1

    # A late redelivery (e.g. after a visibility timeout) of the finished job changes nothing.
    send(celery_client, job_id, queue)
    wait_for("the third delivery", lambda: _deliveries(two_workers, job_id) == (1, 2), 30)
    assert len(job_events(engine, job_id)) == len(events)
    assert job_row(engine, job_id).attempt == 1
