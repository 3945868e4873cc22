"""No request makes a 500: junk bodies, headers and queries on every route get a 4xx (or 2xx)
with the contract's error body. The client re-raises any server exception, so a crash fails."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import ProjectKey
from tests.integration.api.code_archives import code_files, tar_gz, upload
from tests.integration.api.conftest import job_spec, submit

BODIES: list[tuple[bytes, str]] = [
    (b"", "application/json"),
    (b"null", "application/json"),
    (b"[]", "application/json"),
    (b'"text"', "application/json"),
    (b"{}", "application/json"),
    (b"1e999", "application/json"),
    (b'{"name": {"$gt": ""}, "uri": ["x"]}', "application/json"),
    (b'{"name": "x", "data": {"dataset": null, "uri": null}}', "application/json"),
    (b"[" * 100_000, "application/json"),
    (b'{"a": "\\ud800\\u0000"}', "application/json"),
    (b"\x00\xff\xfe", "application/json"),
    (b"name=x&file=y", "application/x-www-form-urlencoded"),
    (b"--x\r\n\r\n--x--\r\n", "multipart/form-data; boundary=x"),
    (
        b"--x\r\nContent-Disposition: form-data\r\n\r\nv\r\n--x--\r\n",
        "multipart/form-data; boundary=x",
    ),
    (b"hello", "text/plain"),
    (b"hello", "multipart/form-data; boundary="),
]
QUERY = "?limit=-1&after=x&cursor=%ff%fe&state=&names=,,,&rank=1e10&name=%00"


@pytest.fixture
def paths(client: TestClient, project: ProjectKey, dataset: dict[str, Any]) -> list[str]:
    job = submit(client, project, job_spec(dataset["id"]))
    chat = (
        b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
    )
    chat_dataset = client.post(
        "/v1/datasets/upload",
        data={"name": "chat"},
        files={"file": ("chat.jsonl", chat + b"\n", "application/octet-stream")},
        headers=project.headers,
    ).json()["id"]
    code = upload(client, project, tar_gz(code_files())).json()["id"]
    jid = job["id"]
    person, bot = {"subject": "a@x.org", "role": "viewer"}, {"name": "a", "role": "viewer"}
    member = client.post("/v1/members", json=person, headers=project.headers).json()["id"]
    account = client.post("/v1/service-accounts", json=bot, headers=project.headers).json()["id"]
    key = client.post("/v1/keys", json={"name": "k"}, headers=project.headers).json()["id"]
    return [
        "/",
        "/healthz",
        "/readyz",
        "/v1/me",
        "/v1/spec/schema",
        "/v1/jobs",
        f"/v1/jobs/{jid}",
        f"/v1/jobs/{jid}/cancel",
        f"/v1/jobs/{jid}/events",
        f"/v1/jobs/{jid}/metrics",
        f"/v1/jobs/{jid}/logs",
        f"/v1/jobs/{jid}/checkpoints",
        f"/v1/jobs/{jid}/checkpoints/1/export",
        f"/v1/jobs/{jid}/checkpoints/%00/export/download",
        "/v1/jobs/-1/events",
        "/v1/jobs/%00",
        "/v1/datasets",
        "/v1/datasets/upload",
        f"/v1/datasets/{dataset['id']}",
        f"/v1/datasets/{dataset['id']}/preview",
        f"/v1/datasets/{chat_dataset}/preview",
        "/v1/datasets/%ff%00/preview",
        "/v1/datasets/%ff%00",
        "/v1/code",
        f"/v1/code/{code}",
        "/v1/code/%ff%00",
        "/v1/projects",
        "/v1/members",
        f"/v1/members/{member}",
        "/v1/members/%ff%00",
        "/v1/service-accounts",
        f"/v1/service-accounts/{account}",
        "/v1/service-accounts/%00",
        "/v1/keys",
        f"/v1/keys/{key}",
        "/v1/keys/%ff%00",
        "/v1/../../etc/passwd",
    ]


def _check(answer: Any) -> None:
    assert answer.status_code < 500, (answer.request.method, answer.request.url, answer.text)
    if answer.status_code >= 400:
        error = answer.json()["error"]
        assert isinstance(error["code"], str) and isinstance(error["details"], list)


def test_junk_bodies_never_crash_the_server(
    client: TestClient, project: ProjectKey, paths: list[str]
) -> None:
    for path in paths:
        for body, content_type in BODIES:
            answer = client.post(
                path, content=body, headers={**project.headers, "content-type": content_type}
            )
            _check(answer)


def test_junk_queries_and_methods_never_crash_the_server(
    client: TestClient, project: ProjectKey, paths: list[str]
) -> None:
    for path in paths:
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"):
            for headers in (project.headers, {}, {"Authorization": "Bearer \x7f"}):
                answer = client.request(method, path + QUERY, headers=headers)
                if method != "HEAD":
                    _check(answer)
                else:
                    assert answer.status_code < 500
