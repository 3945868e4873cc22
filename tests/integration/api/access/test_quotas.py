"""Quotas over REST: set and read them with usage, a job over its project's quota waits with the
reason and an estimated start, the queued limit and per-key rate limits answer 429 with
`Retry-After`."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, update

from api.main import create_app
from core.platform.db import session_scope
from core.platform.settings import Settings
from core.platform.tables import Job, JobNode, JobState, Worker, utcnow
from core.scheduling import claim as scheduling
from tests.conftest import ProjectKey, make_project
from tests.integration.api.conftest import assert_error, job_spec, queued_job_ids, submit


def _put(client: TestClient, project: ProjectKey, pool: str, body: dict[str, Any]) -> Any:
    return client.put(f"/v1/quotas/{pool}", json=body, headers=project.headers)


def _claim_and_run(engine: Engine, pool: str, *, ran_s: float, step: int) -> int:
    """A worker `w-<pool>` claims the best job of the pool, which then runs at `step`/20."""
    with session_scope(engine) as s:
        job = scheduling.claim_next(session=s, pool=pool, worker=f"w-{pool}")
        assert job is not None
        started = utcnow() - timedelta(seconds=ran_s)
        s.execute(
            update(Job)
            .where(Job.id == job.id)
            .values(state=JobState.RUNNING, started_at=started, current_step=step)
        )
        s.add(
            JobNode(job_id=job.id, attempt=job.attempt, node_rank=0, worker=f"w-{pool}",
                    joined_at=started, devices=[0])
        )  # fmt: skip
        return job.id


def test_the_third_job_of_a_project_capped_at_two_gpus_waits_with_reason_and_estimate(
    client: TestClient,
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
) -> None:
    quota = _put(client, project, pool, {"max_slots": 2})
    assert quota.status_code == 200, quota.text
    assert quota.json()["max_slots"] == 2 and quota.json()["weight"] == 1.0
    ids = [submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))["id"]]
    ids += [submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))["id"]]
    third = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))["id"]
    now = utcnow()
    with session_scope(engine) as s:
        s.add(Worker(name=f"w-{pool}", pool=pool, host="h", pid=1, started_at=now,
                     heartbeat_at=now, slots_total=2, slots_free=0))  # fmt: skip
    assert _claim_and_run(engine, pool, ran_s=60, step=10) == ids[0]  # 60 s left
    assert _claim_and_run(engine, pool, ran_s=10, step=10) == ids[1]  # 10 s left

    shown = client.get(f"/v1/jobs/{third}", headers=project.headers).json()
    assert shown["state"] == "queued"
    assert shown["queue"]["position"] == 1 and shown["queue_position"] == 1
    assert shown["queue"]["reason"] == "quota gpus 2/2"
    start = shown["queue"]["estimated_start_at"]
    assert start is not None
    # The second job's end (in ~10 s) frees a device and a place in the quota.
    listed = client.get("/v1/jobs", headers=project.headers).json()["items"]
    [again] = [j["queue"] for j in listed if j["id"] == third]
    assert (again["position"], again["reason"]) == (1, "quota gpus 2/2")
    later = datetime.fromisoformat(again["estimated_start_at"]) - datetime.fromisoformat(start)
    assert abs(later.total_seconds()) < 2
    assert all(j["queue"] is None for j in listed if j["id"] != third)
    eta = datetime.fromisoformat(start)
    assert now + timedelta(seconds=5) < eta < now + timedelta(seconds=30)

    quotas = client.get("/v1/quotas", headers=project.headers).json()["items"]
    assert [
        (q["pool"], q["slots_in_use"], q["running_jobs"], q["queued_jobs"]) for q in quotas
    ] == [(pool, 2, 2, 1)]

    # Raising the quota wakes the pool for the waiting job (a claim message for it).
    before = queued_job_ids(settings.broker_url, pool)
    assert _put(client, project, pool, {"max_slots": 3}).json()["max_slots"] == 3
    assert queued_job_ids(settings.broker_url, pool) == [*before, third]
    assert client.get(f"/v1/jobs/{third}", headers=project.headers).json()["queue"]["reason"] in (
        "no free worker",
        "claimable now",
    )


def test_the_queued_limit_answers_429_with_retry_after(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str
) -> None:
    assert _put(client, project, "*", {"max_queued_jobs": 1}).status_code == 200
    spec = job_spec(dataset["id"], resources={"pool": pool})
    first = submit(client, project, spec, **{"Idempotency-Key": "once"})
    refused = client.post("/v1/jobs", json=spec, headers=project.headers)
    error = assert_error(refused, 429, "quota_exceeded", ["body", "resources", "pool"])
    assert "quota queued jobs 1/1" in error["message"]
    assert refused.headers["Retry-After"] == "60"
    # A retry of the job already made is a replay, not a new job.
    replay = client.post(
        "/v1/jobs", json=spec, headers={**project.headers, "Idempotency-Key": "once"}
    )
    assert replay.status_code == 200 and replay.json()["id"] == first["id"]
    assert _put(client, project, "*", {}).json()["max_queued_jobs"] is None
    submit(client, project, spec)


def test_bad_quota_values_are_422_with_field_paths_and_quotas_are_per_project(
    client: TestClient, engine: Engine, project: ProjectKey
) -> None:
    cases = [
        ("default", {"max_slots": -1}, ["body", "max_slots"]),
        ("default", {"weight": 0}, ["body", "weight"]),
        ("default", {"monthly_slot_hours": "lots"}, ["body", "monthly_slot_hours"]),
        ("default", {"max_gpus": 2}, ["body", "max_gpus"]),
        ("no pool", {}, ["path", "pool"]),
    ]
    for pool, body, loc in cases:
        assert_error(_put(client, project, pool, body), 422, "validation_error", loc)
    assert _put(client, project, "default", {"weight": 3}).status_code == 200
    other = make_project(engine)
    assert client.get("/v1/quotas", headers=other.headers).json() == {"items": []}
    mine = client.get("/v1/quotas", headers=project.headers).json()["items"]
    assert [(q["pool"], q["weight"], q["max_slots"]) for q in mine] == [("default", 3.0, None)]


def test_per_key_rate_limit_answers_429_with_retry_after(
    settings: Settings, engine: Engine
) -> None:
    limited = settings.model_copy(update={"rate_limit_per_minute": 3})
    one, two = make_project(engine), make_project(engine)
    with TestClient(create_app(limited)) as client:
        for _ in range(3):
            assert client.get("/v1/me", headers=one.headers).status_code == 200
        refused = client.get("/v1/me", headers=one.headers)
        assert_error(refused, 429, "too_many_requests")
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert client.get("/v1/me", headers=two.headers).status_code == 200  # its own budget
        assert client.get("/healthz").status_code == 200  # no key: not counted
