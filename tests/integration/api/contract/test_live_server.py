"""The API under a real uvicorn (the `live_api` fixture), as the CLI and dashboard reach it."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, func, select

from core.platform.tables import Job
from tests.conftest import ProjectKey


def _register(base: str, headers: dict[str, str], corpus_dir: Path) -> dict[str, Any]:
    answer = httpx.post(
        f"{base}/v1/datasets", json={"name": "c", "uri": str(corpus_dir)}, headers=headers
    )
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def _submit_at_once(
    base: str, n: int, spec: dict[str, Any], headers: dict[str, str]
) -> list[httpx.Response]:
    """`n` POST /v1/jobs of `spec`, each from its own thread and connection, released together
    by a barrier."""
    barrier = threading.Barrier(n)
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def submit() -> None:
        with httpx.Client(base_url=base, timeout=60) as http:
            barrier.wait()
            answer = http.post("/v1/jobs", json=spec, headers=headers)
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=submit) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_live_server_serves_the_contract(live_api: str, api_key: str, corpus_dir: Path) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    assert httpx.get(f"{live_api}/v1/me", headers=headers).status_code == 200
    assert httpx.get(f"{live_api}/v1/me").json()["error"]["code"] == "unauthorized"
    ds = _register(live_api, headers, corpus_dir)
    job = httpx.post(
        f"{live_api}/v1/jobs", json={"name": "live", "data": {"dataset": ds["id"]}}, headers=headers
    )
    assert job.status_code == 201, job.text
    listed = httpx.get(f"{live_api}/v1/jobs", headers=headers).json()
    assert [j["id"] for j in listed["items"]] == [job.json()["id"]]


def test_concurrent_submits_with_one_idempotency_key_make_one_job(
    live_api: str, project: ProjectKey, corpus_dir: Path, engine: Engine
) -> None:
    ds = _register(live_api, project.headers, corpus_dir)
    spec = {"name": "race", "data": {"dataset": ds["id"]}}
    n = 8
    race = {**project.headers, "Idempotency-Key": "race-1"}
    answers = _submit_at_once(live_api, n, spec, race)
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * (n - 1) + [201], [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    with engine.connect() as conn:
        stored = conn.scalar(
            select(func.count()).where(
                Job.project_id == project.project_id, Job.idempotency_key == "race-1"
            )
        )
    assert stored == 1


def test_live_upload_over_the_limit_is_refused_before_the_body_is_sent(
    live_api: str, project: ProjectKey
) -> None:
    # Declare 1 TiB and send nothing: the answer must come from the header alone.
    host, port = live_api.removeprefix("http://").split(":")
    request = (
        "POST /v1/datasets/upload HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        f"Authorization: Bearer {project.api_key}\r\n"
        "Content-Type: multipart/form-data; boundary=b\r\n"
        f"Content-Length: {1 << 40}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request.encode())
        raw = b""
        while b"\r\n\r\n" not in raw or not raw.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), raw
    assert json.loads(body)["error"]["code"] == "payload_too_large"


def test_a_burst_of_concurrent_submits_never_overshoots_the_queued_limit(
    live_api: str, project: ProjectKey, corpus_dir: Path, engine: Engine
) -> None:
    limit, n = 3, 10
    put = httpx.put(
        f"{live_api}/v1/quotas/*", json={"max_queued_jobs": limit}, headers=project.headers
    )
    assert put.status_code == 200, put.text
    ds = _register(live_api, project.headers, corpus_dir)
    spec = {"name": "burst", "data": {"dataset": ds["id"]}}
    answers = _submit_at_once(live_api, n, spec, project.headers)
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] * limit + [429] * (n - limit), [a.text for a in answers]
    with engine.connect() as conn:
        stored = conn.scalar(select(func.count()).where(Job.project_id == project.project_id))
    assert stored == limit
