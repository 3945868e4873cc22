"""Fixtures for the API tests: the app on the session's real Postgres, a client, datasets."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from api.main import create_app
from core.jobs import service as jobs
from core.platform.db import session_scope
from core.platform.queue import RUN_JOB_TASK
from core.platform.settings import Settings
from core.platform.tables import Dataset, Job, JobEvent, JobState
from tests.conftest import ProjectKey

# Endpoints under /v1/jobs/{id} as (method, suffix), for the tests that each is 404 for a job
# that is not the caller's (another project's, or none).
JOB_ENDPOINTS = [
    ("get", ""),
    ("post", "/cancel"),
    ("get", "/events"),
    ("get", "/metrics"),
    ("get", "/logs"),
    ("get", "/checkpoints"),
    ("post", "/checkpoints/1/export"),
    ("get", "/checkpoints/1/export"),
    ("get", "/checkpoints/1/export/download"),
]


@pytest.fixture(scope="session")
def client(settings: Settings) -> Iterator[TestClient]:
    """A client of the app (lifespan run: the migration check passed). Errors raise, not 500."""
    with TestClient(create_app(settings), raise_server_exceptions=True) as test_client:
        yield test_client


@pytest.fixture
def dataset(client: TestClient, project: ProjectKey, corpus_dir: Path) -> dict[str, Any]:
    """The session corpus registered as a dataset of `project`."""
    answer = client.post(
        "/v1/datasets", json={"name": "corpus", "uri": str(corpus_dir)}, headers=project.headers
    )
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


@pytest.fixture
def pool() -> str:
    """A queue of this test's own, so its dispatched messages can be found."""
    return f"test-{secrets.token_hex(4)}"


def job_spec(dataset_id: str, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "tiny",
        "data": {"dataset": dataset_id},
        "train": {"max_steps": 20},
        "eval": {"interval_steps": 10},
    }
    spec.update(overrides)
    return spec


def submit(
    client: TestClient, project: ProjectKey, spec: dict[str, Any], **headers: str
) -> dict[str, Any]:
    answer = client.post("/v1/jobs", json=spec, headers={**project.headers, **headers})
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def set_running(engine: Engine, job_id: int, worker: str = "w1") -> None:
    """Move a queued job to `running` as if `worker` had claimed it and started its trainer."""
    with session_scope(engine) as s:
        assert jobs.claim(session=s, job_id=job_id, worker=worker) is not None
        jobs.transition(session=s, job_id=job_id, to=JobState.RUNNING)


def assert_error(
    answer: httpx.Response, status: int, code: str, loc: list[Any] | None = None
) -> dict[str, Any]:
    """The answer has `status` and the contract's error body; `loc` is among its details."""
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"code", "message", "details"}
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    for detail in error["details"]:
        # `line`/`column` where a text was parsed (a spec's YAML, a dataset's JSONL).
        assert {"loc", "msg", "type"} <= set(detail) <= {"loc", "msg", "type", "line", "column"}
        assert isinstance(detail["loc"], list)
    if loc is not None:
        locs = [d["loc"] for d in error["details"]]
        assert loc in locs, locs
    return dict(error)


def queued_messages(broker_url: str, queue: str) -> list[tuple[str, int]]:
    """(task name, first argument) of the Celery messages waiting in a Redis queue, oldest
    first."""
    client = redis.Redis.from_url(broker_url)
    try:
        found = []
        for raw in reversed(client.lrange(queue, 0, -1)):  # LPUSH: newest first
            message = json.loads(raw)
            args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            found.append((message["headers"]["task"], args[0]))
        return found
    finally:
        client.close()


def queued_job_ids(broker_url: str, queue: str) -> list[int]:
    """Job ids of the messages waiting in a Redis queue, oldest first; all are `run_job`."""
    messages = queued_messages(broker_url, queue)
    assert {task for task, _ in messages} <= {RUN_JOB_TASK}, messages
    return [job_id for _, job_id in messages]


@dataclass(frozen=True)
class Counts:
    jobs: int
    events: int
    datasets: int


def counts(engine: Engine, project_id: str) -> Counts:
    """How many rows the project has: to prove a refused request stored nothing."""
    with engine.connect() as conn:
        jobs = conn.scalar(select(func.count()).where(Job.project_id == project_id))
        events = conn.scalar(
            select(func.count())
            .select_from(JobEvent)
            .join(Job, Job.id == JobEvent.job_id)
            .where(Job.project_id == project_id)
        )
        datasets = conn.scalar(select(func.count()).where(Dataset.project_id == project_id))
    return Counts(jobs=jobs or 0, events=events or 0, datasets=datasets or 0)
