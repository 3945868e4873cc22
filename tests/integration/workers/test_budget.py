"""`limits.max_cost`: a real worker on a priced pool measures the job's CPU-seconds and, once
the job's cost reaches the limit, stops the trainer with a checkpoint and fails the job with
reason `budget`; the job's usage then shows what it used."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from api.main import create_app
from core.jobs import service as jobs
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    TERMINAL,
    UNTIL_STOPPED,
    Worker,
    job_events,
    job_nodes,
    launches,
    send,
    start_worker,
    submit,
    tiny_spec,
    unique_queue,
    wait_state,
)

PRICE = 36.0  # per slot-hour: 0.01 per slot-second


@pytest.fixture(scope="module")
def priced_worker(settings: Settings, celery_client: Celery, worker_logs: Path) -> Iterator[Worker]:
    """A worker whose own queue (pool) costs `PRICE` per slot-hour."""
    queue = unique_queue("budget")
    env = {"TORCHYARD_SLOT_PRICES": json.dumps({queue: PRICE}), "TORCHYARD_CURRENCY": "EUR"}
    w = start_worker(
        settings=settings, client=celery_client, queue=queue, log_dir=worker_logs, extra_env=env
    )
    yield w
    w.stop()


def test_max_cost_checkpoints_and_stops_the_run_with_reason_budget(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    priced_worker: Worker,
) -> None:
    spec = tiny_spec(
        pool=priced_worker.queue,
        dataset_id=dataset_id,
        **UNTIL_STOPPED,
        limits={"max_cost": 0.001},  # a tenth of a slot-second: spent before the first step
        retries={"max_restarts": 3},  # a limit is not retried
    )
    job_id = submit(engine, celery_client, project, spec)
    job = wait_state(engine, job_id, TERMINAL, 60, priced_worker)
    assert job.state == "failed" and job.attempt == 1, job.error
    assert job.error == "budget: limits.max_cost reached"
    assert job.failure is None and job.restarts_used == 0  # a limit: no failure class
    events = job_events(engine, job_id)
    assert [e.kind for e in events].count("checkpoint") == 1  # the stop saved one
    failed = events[-1]
    assert failed.state_to == "failed"
    assert failed.data["limit"] == "max_cost" and failed.data["reason"] == "budget"
    (node,) = job_nodes(engine, job_id)
    assert len(launches(events)) == 1
    assert node.stop == "budget" and node.cpu_seconds > 0

    # A retry of a job whose budget is spent fails at once, without a trainer.
    with Session(engine) as s:
        jobs.retry(session=s, job_id=job_id, project_id=project.project_id)
        s.commit()
    send(celery_client, job_id, priced_worker.queue)
    again = wait_state(engine, job_id, TERMINAL, 30, priced_worker)
    assert again.state == "failed" and again.attempt == 2
    assert again.error is not None and again.error.startswith("budget: limits.max_cost reached")
    retried = job_events(engine, job_id)
    assert len(launches(retried)) == 1  # attempt 1's only
    assert retried[-1].data["limit"] == "max_cost" and retried[-1].data["reason"] == "budget"

    app = create_app(settings.model_copy(update={"slot_prices": {priced_worker.queue: PRICE}}))
    with TestClient(app) as client:
        shown = client.get(f"/v1/jobs/{job_id}", headers=project.headers).json()["usage"]
    assert shown["cpu_seconds"] == node.cpu_seconds > 0
    assert shown["cost"] >= 0.001
    assert shown["cost"] == pytest.approx(shown["slot_seconds"] * PRICE / 3600)
