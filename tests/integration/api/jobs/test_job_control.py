"""Pause, resume and retry over the API, and why a queued job waits (its place in the queue)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update

from core.platform.db import session_scope
from core.platform.tables import Job
from tests.conftest import ProjectKey
from tests.integration.api.conftest import (
    assert_error,
    job_spec,
    queued_job_ids,
    set_running,
    submit,
)


def _post(client: TestClient, project: ProjectKey, job_id: int, action: str) -> Any:
    return client.post(f"/v1/jobs/{job_id}/{action}", headers=project.headers)


def test_queued_jobs_say_their_place_in_the_pool_queue_by_priority_then_age(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str
) -> None:
    def job(priority: int) -> dict[str, Any]:
        spec = job_spec(dataset["id"], priority=priority, resources={"pool": pool})
        return submit(client, project, spec)

    old, urgent, young = job(0), job(5), job(0)
    assert (old["queue_position"], urgent["queue_position"], young["queue_position"]) == (1, 1, 3)
    got = {
        j["id"]: (j["queue_position"], j["waiting_for"])
        for j in client.get("/v1/jobs", headers=project.headers).json()["items"]
    }
    waiting = f"a free worker on pool {pool!r}"
    assert got[urgent["id"]] == (1, waiting)
    assert got[old["id"]] == (2, waiting)
    assert got[young["id"]] == (3, waiting)

    assert _post(client, project, urgent["id"], "pause").json()["state"] == "paused"
    paused = client.get(f"/v1/jobs/{urgent['id']}", headers=project.headers).json()
    assert paused["queue_position"] is None and "resume" in paused["waiting_for"]
    assert (
        client.get(f"/v1/jobs/{young['id']}", headers=project.headers).json()["queue_position"] == 2
    )


def test_a_queued_gang_says_it_waits_for_as_many_free_workers_as_nodes(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str
) -> None:
    spec = job_spec(dataset["id"], resources={"pool": pool, "nodes": 3})
    job = submit(client, project, spec)
    assert job["waiting_for"] == f"3 free workers at once on pool {pool!r} (a gang of 3 nodes)"


def test_pause_resume_and_their_illegal_transitions(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str, settings: Any
) -> None:
    job = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    assert_error(_post(client, project, job["id"], "resume"), 409, "conflict", ["state"])
    assert _post(client, project, job["id"], "pause").json()["state"] == "paused"
    assert _post(client, project, job["id"], "pause").json()["state"] == "paused"  # idempotent
    resumed = _post(client, project, job["id"], "resume")
    assert resumed.status_code == 202 and resumed.json()["state"] == "queued"
    assert queued_job_ids(settings.broker_url, pool) == [job["id"], job["id"]]  # re-dispatched
    conflict = assert_error(_post(client, project, job["id"], "resume"), 409, "conflict")
    assert conflict["details"][0]["type"] == "queued"


def test_pausing_a_running_job_asks_its_worker_and_cancel_still_works(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], engine: Engine
) -> None:
    job = submit(client, project, job_spec(dataset["id"]))
    set_running(engine, job["id"])
    for _ in range(2):
        answer = _post(client, project, job["id"], "pause")
        assert answer.status_code == 202 and answer.json()["state"] == "pausing"
    assert_error(_post(client, project, job["id"], "retry"), 409, "conflict", ["state"])
    assert _post(client, project, job["id"], "cancel").json()["state"] == "cancelling"


def test_retry_requeues_a_cancelled_job_and_refuses_a_queued_one(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str
) -> None:
    job = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    assert _post(client, project, job["id"], "cancel").json()["state"] == "cancelled"
    retried = _post(client, project, job["id"], "retry")
    assert retried.status_code == 202, retried.text
    body = retried.json()
    assert body["state"] == "queued" and body["finished_at"] is None
    assert body["queue_position"] == 1
    assert_error(_post(client, project, job["id"], "retry"), 409, "conflict", ["state"])
    events = client.get(f"/v1/jobs/{job['id']}/events", headers=project.headers).json()["items"]
    assert [(e["state_from"], e["state_to"]) for e in events][-1] == ("cancelled", "queued")
    assert events[-1]["data"] == {"cause": "retry"}


def test_a_resumed_job_reports_its_trained_time_and_eta_over_every_attempt(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], engine: Engine
) -> None:
    """`running_s`/`eta_s` count the whole run: the latest attempt started a minute ago, but the
    job had trained 500 s before its pause (issue 15)."""
    job = submit(client, project, job_spec(dataset["id"], train={"max_steps": 100}))
    set_running(engine, job["id"])
    with session_scope(engine) as s:
        s.execute(
            update(Job)
            .where(Job.id == job["id"])
            .values(
                runtime_s=500.0,
                current_step=50,
                started_at=datetime.now(UTC) - timedelta(seconds=60),
            )
        )
    got = client.get(f"/v1/jobs/{job['id']}", headers=project.headers).json()
    assert 560.0 <= got["running_s"] < 600.0
    assert got["eta_s"] == pytest.approx(50 * got["running_s"] / 50, rel=0.05)
