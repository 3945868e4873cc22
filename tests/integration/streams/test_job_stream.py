"""GET /v1/jobs/{id}/stream against a live uvicorn: resume with Last-Event-ID, no gaps, no
duplicates, and the end of the stream once the job is terminal."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from core.jobs import service as jobs
from core.jobs import upserts
from core.platform.db import session_scope
from core.platform.tables import Job, JobState
from tests.conftest import ProjectKey
from torchyard.client import Client


@pytest.fixture
def live_job(live_api: str, project: ProjectKey, corpus_dir: Path) -> dict[str, Any]:
    """A queued job on a pool no worker serves: the test writes its reports itself."""
    with httpx.Client(base_url=live_api, headers=project.headers, timeout=30) as http:
        ds = http.post("/v1/datasets", json={"name": "corpus", "uri": str(corpus_dir)})
        assert ds.status_code == 201, ds.text
        spec = {
            "name": "streamed",
            "data": {"dataset": ds.json()["id"]},
            "train": {"max_steps": 20},
            "eval": {"interval_steps": 10},
            "resources": {"pool": f"nobody-{secrets.token_hex(3)}"},
        }
        answer = http.post("/v1/jobs", json=spec)
        assert answer.status_code == 201, answer.text
        return dict(answer.json())


class Reporter:
    """Writes what a worker would: metric lines, log lines, events (in their own commits)."""

    def __init__(self, engine: Engine, job_id: int) -> None:
        self.engine, self.job_id, self.step, self.offset = engine, job_id, 0, 0

    def report(self, n: int) -> None:
        with session_scope(self.engine) as s:
            job = s.get(Job, self.job_id)
            assert job is not None
            for _ in range(n):
                self.step += 1
                point = upserts.Metric("loss", self.step, 1.0 / self.step, 1000.0 + self.step)
                upserts.metrics(session=s, job_id=self.job_id, attempt=1, points=[point])
                line = upserts.Log(
                    rank=0, stream="stdout", offset=self.offset, line=f"step {self.step}"
                )
                upserts.logs(session=s, job_id=self.job_id, attempt=1, lines=[line])
                self.offset += 100
                jobs.add_event(session=s, job=job, kind="info", message=f"at {self.step}", data={})

    def finish(self) -> None:
        with session_scope(self.engine) as s:
            jobs.cancel(session=s, job_id=self.job_id)


def _read_until(stream: Any, stop: Any) -> list[tuple[str, str, dict[str, Any]]]:
    got = []
    for message in stream:
        got.append(message)
        if stop(got):
            break
    return got


def test_stream_resumes_after_disconnect_without_gaps_or_duplicates(
    live_api: str, project: ProjectKey, live_job: dict[str, Any], engine: Engine
) -> None:
    job_id = live_job["id"]
    reporter = Reporter(engine, job_id)
    reporter.report(5)
    with Client(live_api, project.api_key) as client:
        # First connection: the history so far, then live lines; disconnect mid-way.
        first = client.jobs.stream(job_id)
        got = _read_until(first, lambda g: sum(k == "metric" for _, k, _ in g) == 5)
        reporter.report(3)  # arrives through the shared feed while connected
        got += _read_until(first, lambda g: sum(k == "log" for _, k, _ in g) == 3)
        first.close()  # the client goes away
        last_id = got[-1][0]
        reporter.report(4)  # written while nobody watches
        second = client.jobs.stream(job_id, last_event_id=last_id)
        got += _read_until(second, lambda g: sum(k == "metric" for _, k, _ in g) >= 1)
        reporter.report(2)
        got += _read_until(second, lambda g: sum(k == "event" for _, k, _ in g) >= 2)
        reporter.finish()
        got += list(second)  # until `end`
    kinds = [k for _, k, _ in got]
    assert kinds[-1] == "end" and got[-1][2] == {"state": "cancelled"}
    steps = [d["step"] for _, k, d in got if k == "metric"]
    assert steps == list(range(1, 15))
    lines = [d["line"] for _, k, d in got if k == "log"]
    assert lines == [f"step {i}" for i in range(1, 15)]
    events = [d["message"] for _, k, d in got if k == "event" and d["kind"] == "info"]
    assert events == [f"at {i}" for i in range(1, 15)]
    event_ids = [d["id"] for _, k, d in got if k == "event"]
    assert event_ids == sorted(set(event_ids))
    states = [d["state"] for _, k, d in got if k == "job"]
    assert states[0] == JobState.QUEUED and states[-1] == JobState.CANCELLED
    assert all(i for i, _, _ in got)  # every message has an id to resume from


def test_stream_of_a_finished_job_replays_and_ends(
    live_api: str, project: ProjectKey, live_job: dict[str, Any], engine: Engine
) -> None:
    reporter = Reporter(engine, live_job["id"])
    reporter.report(3)
    reporter.finish()
    with Client(live_api, project.api_key) as client:
        got = list(client.jobs.stream(live_job["id"]))
    assert [d["step"] for _, k, d in got if k == "metric"] == [1, 2, 3]
    assert got[-1][1] == "end"
    # Resuming from the end replays nothing but the state and the end.
    with Client(live_api, project.api_key) as client:
        again = list(client.jobs.stream(live_job["id"], last_event_id=got[-1][0]))
    assert [k for _, k, _ in again] == ["job", "end"]


def test_stream_needs_a_key_of_the_jobs_project(
    live_api: str, live_job: dict[str, Any], other_project: ProjectKey
) -> None:
    url = f"{live_api}/v1/jobs/{live_job['id']}/stream"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers=other_project.headers).status_code == 404
