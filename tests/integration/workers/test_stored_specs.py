"""A stored spec never makes a job unreadable: rows whose spec today's `JobSpec` refuses (an
older or unknown `spec_version`, a field this release does not know, a required field missing,
a value tightened since, not an object at all) are read leniently on every job route and by the
worker's ingest, with what was repaired shown as the job's `spec_problems`; the worker refuses
to run such a job rather than guess."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from api.main import create_app
from core.jobs import service as jobs
from core.platform.db import session_factory
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    create_job,
    job_row,
    metric_series,
    tiny_spec,
    unique_queue,
)
from workers import node
from workers.ingest import RunIngest
from workers.launcher import RunPaths


def _stored(pool: str, dataset_id: str) -> dict[str, Any]:
    return tiny_spec(pool=pool, dataset_id=dataset_id).model_dump(mode="json")


def _without(spec: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != key}


# (case, how the stored spec is spoiled, a field its problems must name)
CASES = [
    ("old_version", lambda s: {**s, "spec_version": 0}, "spec_version"),
    ("newer_version", lambda s: {**s, "spec_version": 7}, "spec_version"),
    (
        "unknown_fields",
        lambda s: {**s, "warm_start": "x", "optim": {**s["optim"], "learning_rate": 1}},
        "optim.learning_rate",
    ),
    ("missing_data", lambda s: _without(s, "data"), "data"),
    ("missing_name", lambda s: _without(s, "name"), "name"),
    ("tightened_value", lambda s: {**s, "train": {**s["train"], "max_steps": -5}}, "max_steps"),
    ("not_an_object", lambda s: ["a", "list"], "list"),
]


@pytest.fixture(scope="module")
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), raise_server_exceptions=True) as test_client:
        yield test_client


def _spoil(engine: Engine, job_id: int, spec: Any) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET spec = CAST(:spec AS jsonb) WHERE id = :id"),
            {"spec": json.dumps(spec), "id": job_id},
        )


def _job_routes(client: TestClient) -> list[tuple[str, str]]:
    """(method, path template) of every API route about one job, from the OpenAPI document;
    but its live stream, which answers 200 and stays open while the job is queued."""
    paths = client.get("/openapi.json").json()["paths"]
    return sorted(
        (method.upper(), path)
        for path, operations in paths.items()
        if "{job_id}" in path and not path.endswith("/stream")
        for method in operations
        if method in ("get", "post", "put", "patch", "delete")
    )


@pytest.mark.parametrize(("case", "spoil", "named"), CASES, ids=[c[0] for c in CASES])
def test_every_job_route_reads_a_job_whose_stored_spec_no_longer_validates(
    client: TestClient,
    engine: Engine,
    project: ProjectKey,
    dataset_id: str,
    case: str,
    spoil: Any,
    named: str,
) -> None:
    job_id = create_job(engine, project, tiny_spec(pool=unique_queue(case), dataset_id=dataset_id))
    _spoil(engine, job_id, spoil(_stored("default", dataset_id)))

    shown = client.get(f"/v1/jobs/{job_id}", headers=project.headers)
    assert shown.status_code == 200, shown.text
    problems = shown.json()["spec_problems"]
    assert problems and any(named in p for p in problems), problems
    listed = client.get("/v1/jobs", headers=project.headers).json()["items"]
    assert [j["spec_problems"] for j in listed if j["id"] == job_id] == [problems]

    routes = _job_routes(client)
    assert len(routes) >= 10  # the walk covers the job routes, not a stale subset
    for method, template in routes:
        path = re.sub(r"\{\w+\}", "1", template.replace("{job_id}", str(job_id)))
        answer = client.request(method, path, headers=project.headers, json={})
        assert answer.status_code < 500, (method, path, answer.text)


def test_the_worker_ingests_for_such_a_job_and_refuses_to_start_one(
    engine: Engine, settings: Settings, project: ProjectKey, dataset_id: str, tmp_path: Path
) -> None:
    running = create_job(
        engine, project, tiny_spec(pool=unique_queue("ing"), dataset_id=dataset_id)
    )
    with Session(engine) as s:
        assert jobs.claim(session=s, job_id=running, worker="in-process") is not None
        s.commit()
    spoiled = {**_stored("default", dataset_id), "retries": {"max_restarts": "many"}}
    _spoil(engine, running, spoiled)
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    line = {"type": "metric", "time": 1.0, "attempt": 1, "step": 3, "values": {"loss": 2.5}}
    paths.events.write_text(json.dumps(line) + "\n")
    RunIngest(paths=paths, job_id=running, attempt=1).flush(session_factory(engine))
    assert [(p.step, p.value) for p in metric_series(engine, running, "loss")] == [(3, 2.5)]

    pool = unique_queue("refuse")
    queued = create_job(engine, project, tiny_spec(pool=pool, dataset_id=dataset_id))
    _spoil(engine, queued, {**_stored(pool, dataset_id), "trainer_flavour": "x"})
    outcome = node.run_job(
        queued,
        settings=settings,
        factory=session_factory(engine),
        worker="in-process",
        dispatch=lambda *args: None,
        shutdown=threading.Event(),
    )
    job = job_row(engine, queued)
    assert job.state == "failed", outcome
    assert "trainer_flavour" in (job.error or ""), job.error
