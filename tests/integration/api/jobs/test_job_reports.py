"""What a run reported, as the workers ingest it (core.jobs.upserts), read back over the API."""

from __future__ import annotations

import math
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, insert

from core.jobs import service as jobs
from core.jobs import upserts
from core.platform.db import session_scope
from core.platform.tables import JobState, MetricPoint
from tests.conftest import ProjectKey
from tests.integration.api.conftest import job_spec, submit


@pytest.fixture
def job(client: TestClient, project: ProjectKey, dataset: dict[str, Any]) -> dict[str, Any]:
    return submit(client, project, job_spec(dataset["id"]))


def test_metrics_come_back_as_series_with_their_last_point(
    client: TestClient, project: ProjectKey, job: dict[str, Any], engine: Engine
) -> None:
    with session_scope(engine) as s:
        points = [upserts.Metric("loss", step, 5.0 - step / 10, 1.0 + step) for step in (10, 20)]
        points.append(upserts.Metric("lr", 10, 1e-3, 11.0))
        upserts.metrics(session=s, job_id=job["id"], attempt=1, points=points)
        # a re-ingested point upserts instead of duplicating
        upserts.metrics(
            session=s, job_id=job["id"], attempt=1, points=[upserts.Metric("loss", 20, 2.5, 21.0)]
        )
    url = f"/v1/jobs/{job['id']}/metrics"
    series = client.get(url, headers=project.headers).json()["series"]
    assert series == [
        {
            "name": "loss",
            "steps": [10, 20],
            "values": [4.0, 2.5],
            "last": {"step": 20, "value": 2.5},
        },
        {"name": "lr", "steps": [10], "values": [1e-3], "last": {"step": 10, "value": 1e-3}},
    ]
    only = client.get(url, params={"names": "lr, nope"}, headers=project.headers).json()
    assert [s["name"] for s in only["series"]] == ["lr"]
    latest = client.get(f"/v1/jobs/{job['id']}", headers=project.headers).json()
    assert latest["latest_metrics"] == {"loss": 2.5, "lr": 1e-3}
    assert latest["current_step"] == 20


def test_non_finite_metric_values_are_sent_as_strings_not_a_500(
    client: TestClient, project: ProjectKey, job: dict[str, Any], engine: Engine
) -> None:
    rows = [
        {"job_id": job["id"], "name": "loss", "step": 1, "value": math.nan, "time": 1.0},
        {"job_id": job["id"], "name": "grad_norm", "step": 1, "value": math.inf, "time": 1.0},
    ]
    with session_scope(engine) as s:
        s.execute(insert(MetricPoint), rows)
    answer = client.get(f"/v1/jobs/{job['id']}/metrics", headers=project.headers)
    assert answer.status_code == 200
    by_name = {s["name"]: s for s in answer.json()["series"]}
    assert by_name["loss"]["values"] == ["NaN"]
    assert by_name["grad_norm"]["last"] == {"step": 1, "value": "Infinity"}


def test_a_job_without_metrics_has_no_series(
    client: TestClient, project: ProjectKey, job: dict[str, Any]
) -> None:
    answer = client.get(f"/v1/jobs/{job['id']}/metrics", headers=project.headers)
    assert answer.json() == {"series": []}


def test_logs_page_oldest_first_and_filter_by_rank(
    client: TestClient, project: ProjectKey, job: dict[str, Any], engine: Engine
) -> None:
    lines = [
        upserts.Log(rank=i % 2, stream="stdout", offset=i * 10, line=f"line {i}") for i in range(5)
    ]
    lines.append(upserts.Log(rank=-1, stream="stderr", offset=0, line="launcher says hi"))
    with session_scope(engine) as s:
        upserts.logs(session=s, job_id=job["id"], attempt=1, lines=lines)
        upserts.logs(session=s, job_id=job["id"], attempt=1, lines=lines[:2])  # re-read: skipped
    url = f"/v1/jobs/{job['id']}/logs"
    got: list[str] = []
    after = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if after is not None:
            params["after"] = after
        page = client.get(url, params=params, headers=project.headers).json()
        got += [x["line"] for x in page["items"]]
        after = page["next_cursor"]
        if after is None:
            break
    assert got == [*(f"line {i}" for i in range(5)), "launcher says hi"]
    rank1 = client.get(url, params={"rank": 1}, headers=project.headers).json()["items"]
    assert [x["line"] for x in rank1] == ["line 1", "line 3"]
    launcher = client.get(url, params={"rank": -1}, headers=project.headers).json()["items"]
    assert launcher[0]["stream"] == "stderr"
    assert set(launcher[0]) == {"id", "attempt", "rank", "stream", "line", "created_at"}


def test_events_page_by_after_and_carry_the_transitions(
    client: TestClient, project: ProjectKey, job: dict[str, Any], engine: Engine
) -> None:
    with session_scope(engine) as s:
        jobs.claim(session=s, job_id=job["id"], worker="w1")
        jobs.transition(session=s, job_id=job["id"], to=JobState.RUNNING, message="setup done")
        row = jobs.get_or_raise(session=s, job_id=job["id"])
        jobs.add_event(session=s, job=row, kind="sample", data={"prompt": "def ", "text": "f(x):"})
    url = f"/v1/jobs/{job['id']}/events"
    first = client.get(url, params={"limit": 2}, headers=project.headers).json()
    assert [e["state_to"] for e in first["items"]] == ["queued", "starting"]
    assert first["next_cursor"] == str(first["items"][-1]["id"])
    rest = client.get(url, params={"after": first["next_cursor"]}, headers=project.headers).json()
    assert [e["kind"] for e in rest["items"]] == ["state", "sample"]
    assert rest["items"][0]["message"] == "setup done"
    assert rest["items"][1]["data"] == {"prompt": "def ", "text": "f(x):"}
    assert rest["items"][1]["attempt"] == 1
    assert rest["next_cursor"] is None
    assert set(rest["items"][0]) == {
        "id", "job_id", "attempt", "kind", "state_from", "state_to", "message", "data",
        "created_at",
    }  # fmt: skip


def test_checkpoints_are_listed_by_step(
    client: TestClient, project: ProjectKey, job: dict[str, Any], engine: Engine
) -> None:
    with session_scope(engine) as s:
        for step in (20, 10):
            upserts.checkpoint(
                session=s,
                job_id=job["id"],
                attempt=1,
                step=step,
                uri=f"/ckpt/step_{step:08d}",
                size_bytes=1000 + step,
            )
        again = upserts.checkpoint(
            session=s, job_id=job["id"], attempt=2, step=10, uri="/other", size_bytes=1
        )
        assert again is None  # already recorded: the first record stands
    items = client.get(f"/v1/jobs/{job['id']}/checkpoints", headers=project.headers).json()["items"]
    assert [(c["step"], c["uri"], c["size_bytes"]) for c in items] == [
        (10, "/ckpt/step_00000010", 1010),
        (20, "/ckpt/step_00000020", 1020),
    ]
    assert items[0]["job_id"] == job["id"]
