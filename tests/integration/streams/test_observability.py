"""Prometheus /metrics on the API (route templates, jobs by state, queue depth) and request ids."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ProjectKey


def _samples(client: TestClient) -> dict[str, list[Any]]:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def test_metrics_expose_requests_by_route_template_jobs_by_state_and_queue_depth(
    client: TestClient, project: ProjectKey, job: dict[str, Any]
) -> None:
    for _ in range(3):
        assert client.get(f"/v1/jobs/{job['id']}", headers=project.headers).status_code == 200
    assert client.get("/v1/jobs/999999999", headers=project.headers).status_code == 404
    samples = _samples(client)
    requests = {
        (s.labels["method"], s.labels["route"], s.labels["status"]): s.value
        for s in samples["torchyard_http_requests_total"]
    }
    assert requests[("GET", "/v1/jobs/{job_id}", "200")] >= 3
    assert requests[("GET", "/v1/jobs/{job_id}", "404")] >= 1
    routes = {route for _, route, _ in requests}
    assert f"/v1/jobs/{job['id']}" not in routes and "/v1/jobs/999999999" not in routes
    counts = [
        s for s in samples["torchyard_http_request_duration_seconds_count"]
        if s.labels["route"] == "/v1/jobs/{job_id}"
    ]  # fmt: skip
    assert sum(s.value for s in counts) >= 4
    jobs = {(s.labels["state"], s.labels["pool"]): s.value for s in samples["torchyard_jobs"]}
    assert jobs[("queued", job["pool"])] >= 1
    depth = {s.labels["pool"]: s.value for s in samples["torchyard_queue_depth"]}
    assert depth[job["pool"]] >= 1
    assert "torchyard_stream_watchers" in samples


def test_request_id_is_echoed_or_made_up(client: TestClient) -> None:
    echoed = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert echoed.headers["x-request-id"] == "abc-123"
    made_up = client.get("/healthz", headers={"X-Request-ID": "bad id with space"})
    assert made_up.headers["x-request-id"] not in ("", "bad id with space")
