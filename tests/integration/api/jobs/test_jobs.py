"""Submitting, reading, listing and cancelling jobs over the API."""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.api.conftest import (
    assert_error,
    counts,
    job_spec,
    queued_job_ids,
    set_running,
    submit,
)


def test_submit_stores_a_queued_job_and_dispatches_it_to_its_pool(
    client: TestClient,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
    settings: Settings,
) -> None:
    spec = job_spec(dataset["id"], labels={"team": "ml"}, resources={"pool": pool})
    answer = client.post("/v1/jobs", json=spec, headers=project.headers)
    assert answer.status_code == 201, answer.text
    job = answer.json()
    assert answer.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["state"] == "queued"
    assert job["project_id"] == project.project_id
    assert job["pool"] == pool
    assert job["labels"] == {"team": "ml"}
    assert job["max_steps"] == 20
    assert job["spec"]["data"] == {**job["spec"]["data"], "dataset": dataset["id"]}
    assert job["spec"]["model"]["n_heads"] == 4  # defaults filled in
    assert job["attempt"] == 0 and job["current_step"] is None
    # The submit response leaves out the queue replay (kept cheap); the job itself shows it.
    shown = client.get(f"/v1/jobs/{job['id']}", headers=project.headers).json()
    assert job["queue"] is None and shown.pop("queue")["position"] == 1
    assert {**shown, "queue": None} == job
    assert queued_job_ids(settings.broker_url, pool) == [job["id"]]


def test_submit_succeeds_and_the_job_stays_queued_when_the_broker_is_down(
    settings: Settings, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    down = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(down)) as client:
        started = time.monotonic()
        job = submit(client, project, job_spec(dataset["id"]))
        assert time.monotonic() - started < 15
        assert client.get(f"/v1/jobs/{job['id']}", headers=project.headers).json()["state"] == (
            "queued"
        )


def test_submit_with_a_data_uri_under_an_allowed_root(
    client: TestClient, project: ProjectKey, corpus_dir: Any
) -> None:
    spec = job_spec("x", data={"uri": str(corpus_dir)})
    job = submit(client, project, spec)
    assert job["spec"]["data"]["uri"] == str(corpus_dir)


def test_idempotent_replay_returns_the_first_job_with_200(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], engine: Engine
) -> None:
    spec = job_spec(dataset["id"])
    first = submit(client, project, spec, **{"Idempotency-Key": "abc-1"})
    before = counts(engine, project.project_id)
    again = client.post(
        "/v1/jobs", json=spec, headers={**project.headers, "Idempotency-Key": "abc-1"}
    )
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert counts(engine, project.project_id) == before


def test_same_idempotency_key_with_another_spec_is_409(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], engine: Engine
) -> None:
    submit(client, project, job_spec(dataset["id"]), **{"Idempotency-Key": "k"})
    before = counts(engine, project.project_id)
    other = job_spec(dataset["id"], name="other")
    answer = client.post(
        "/v1/jobs", json=other, headers={**project.headers, "Idempotency-Key": "k"}
    )
    assert_error(answer, 409, "conflict", ["header", "Idempotency-Key"])
    assert counts(engine, project.project_id) == before


def test_idempotency_keys_are_per_project(
    client: TestClient,
    project: ProjectKey,
    other_project: ProjectKey,
    corpus_dir: Any,
) -> None:
    spec = job_spec("x", data={"uri": str(corpus_dir)})
    mine = submit(client, project, spec, **{"Idempotency-Key": "shared"})
    theirs = submit(client, other_project, spec, **{"Idempotency-Key": "shared"})
    assert mine["id"] != theirs["id"]


def test_cancel_a_queued_job_then_again_is_409(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    job = submit(client, project, job_spec(dataset["id"]))
    answer = client.post(f"/v1/jobs/{job['id']}/cancel", headers=project.headers)
    assert answer.status_code == 202
    assert answer.json()["state"] == "cancelled"
    assert answer.json()["finished_at"] is not None
    again = client.post(f"/v1/jobs/{job['id']}/cancel", headers=project.headers)
    assert_error(again, 409, "conflict", ["state"])
    events = client.get(f"/v1/jobs/{job['id']}/events", headers=project.headers).json()["items"]
    assert [(e["state_from"], e["state_to"]) for e in events] == [
        (None, "queued"),
        ("queued", "cancelled"),
    ]


def test_cancel_a_running_job_asks_it_to_stop_and_repeating_is_harmless(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], engine: Engine
) -> None:
    job = submit(client, project, job_spec(dataset["id"]))
    set_running(engine, job["id"])
    for _ in range(2):
        answer = client.post(f"/v1/jobs/{job['id']}/cancel", headers=project.headers)
        assert answer.status_code == 202
        assert answer.json()["state"] == "cancelling"
        assert answer.json()["worker"] == "w1"


def test_pagination_walks_every_job_exactly_once_newest_first(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    made = [
        submit(client, project, job_spec(dataset["id"], name=f"run-{i}"))["id"] for i in range(7)
    ]
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3}
        if cursor is not None:
            params["cursor"] = cursor
        page = client.get("/v1/jobs", params=params, headers=project.headers).json()
        seen += [j["id"] for j in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert isinstance(cursor, str)
    assert seen == sorted(made, reverse=True)
    assert pages == 3


def test_list_filters_by_state_and_name(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    a = submit(client, project, job_spec(dataset["id"], name="alpha-1"))
    b = submit(client, project, job_spec(dataset["id"], name="beta-1"))
    c = submit(client, project, job_spec(dataset["id"], name="alpha_2"))
    client.post(f"/v1/jobs/{a['id']}/cancel", headers=project.headers)

    def ids(**params: Any) -> list[int]:
        page = client.get("/v1/jobs", params=params, headers=project.headers).json()
        return [j["id"] for j in page["items"]]

    assert ids(state="cancelled") == [a["id"]]
    assert ids(state=["queued", "cancelled"]) == [c["id"], b["id"], a["id"]]
    assert ids(name="alpha") == [c["id"], a["id"]]
    assert ids(name="a_") == [c["id"]]  # `_` is a literal, not a LIKE wildcard
    assert ids(name="alpha", state="queued") == [c["id"]]
    assert ids(name="nothing-like-this") == []
