"""The audit log: every mutating request and every 401/403 leaves one row (who, what, target,
when, source, outcome); `GET /v1/audit` lists a project's own rows, newest first, filtered and
paged; an audit outage never fails a request."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from api.main import create_app
from core.platform.settings import OidcGrant, Settings
from core.platform.tables import AuditEvent
from tests.conftest import ProjectKey, make_project
from tests.integration.api.conftest import assert_error, job_spec, submit
from tests.integration.api.oidc_provider import AUDIENCE, Provider, rsa_key, serve


def _rid() -> dict[str, str]:
    return {"X-Request-ID": f"audit-{secrets.token_hex(8)}"}


def _rows(engine: Engine, request_id: str) -> list[AuditEvent]:
    with Session(engine) as s:
        return list(s.scalars(select(AuditEvent).where(AuditEvent.request_id == request_id)))


def _list(client: TestClient, project: ProjectKey, **params: Any) -> dict[str, Any]:
    answer = client.get("/v1/audit", params=params, headers=project.headers)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _only(client: TestClient, project: ProjectKey, request_id: str) -> dict[str, Any]:
    items = [e for e in _list(client, project, limit=500)["items"] if e["request_id"] == request_id]
    assert len(items) == 1, items
    return dict(items[0])


def test_submit_and_cancel_are_audited_with_actor_target_and_outcome(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    created, cancelled = _rid(), _rid()
    job = submit(client, project, job_spec(dataset["id"]), **created)
    answer = client.post(f"/v1/jobs/{job['id']}/cancel", headers={**project.headers, **cancelled})
    assert answer.status_code == 202, answer.text

    row = _only(client, project, created["X-Request-ID"])
    assert row["operation"] == "jobs_create"
    assert row["target"] == str(job["id"])  # the created job, from the 201 body
    assert (row["method"], row["path"], row["status_code"]) == ("POST", "/v1/jobs", 201)
    assert (row["actor"], row["actor_kind"], row["outcome"]) == ("default", "key", "ok")
    assert row["key_id"].startswith("key_")
    assert row["source"] == "testclient"  # the socket peer TestClient reports
    at = datetime.fromisoformat(row["at"])
    assert abs(datetime.now(UTC) - at) < timedelta(minutes=5)

    row = _only(client, project, cancelled["X-Request-ID"])
    assert (row["operation"], row["target"]) == ("jobs_cancel", str(job["id"]))
    assert (row["status_code"], row["outcome"]) == (202, "ok")


def test_a_dataset_upload_is_audited_with_the_new_dataset_as_target(
    client: TestClient, project: ProjectKey
) -> None:
    rid = _rid()
    answer = client.post(
        "/v1/datasets/upload",
        data={"name": "snippets"},
        files={"file": ("code.py", b"def f(x):\n    return x\n" * 50, "text/x-python")},
        headers={**project.headers, **rid},
    )
    assert answer.status_code == 201, answer.text
    row = _only(client, project, rid["X-Request-ID"])
    assert (row["operation"], row["target"]) == ("datasets_upload", answer.json()["id"])


def test_a_failed_mutation_is_audited_as_failed(client: TestClient, project: ProjectKey) -> None:
    rid = _rid()
    answer = client.post("/v1/jobs", json={"name": "x"}, headers={**project.headers, **rid})
    assert answer.status_code == 422
    row = _only(client, project, rid["X-Request-ID"])
    assert (row["operation"], row["outcome"], row["status_code"]) == ("jobs_create", "failed", 422)
    assert row["target"] is None


@pytest.mark.parametrize("method", ["get", "post"])
def test_a_bad_key_is_audited_as_anonymous_and_denied(
    client: TestClient, engine: Engine, method: str
) -> None:
    rid = _rid()
    headers = {"Authorization": "Bearer ty_not-a-real-key", **rid}
    assert_error(client.request(method, "/v1/jobs", headers=headers), 401, "unauthorized")
    [row] = _rows(engine, rid["X-Request-ID"])
    assert row.project_id is None and row.actor is None and row.key_id is None
    assert (row.actor_kind, row.outcome, row.status_code) == ("anonymous", "denied", 401)
    operation = {"get": "jobs_list", "post": "jobs_create"}[method]
    assert (row.method, row.operation) == (method.upper(), operation)


def test_reads_are_not_audited(
    client: TestClient, project: ProjectKey, engine: Engine, dataset: dict[str, Any]
) -> None:
    rids = [_rid() for _ in range(3)]
    paths = ("/v1/jobs", "/v1/me", f"/v1/datasets/{dataset['id']}")
    for path, rid in zip(paths, rids, strict=True):
        assert client.get(path, headers={**project.headers, **rid}).status_code == 200
    assert [_rows(engine, rid["X-Request-ID"]) for rid in rids] == [[], [], []]


def test_filters_and_cursor_pages_walk_the_log_newest_first(
    client: TestClient, engine: Engine
) -> None:
    project = make_project(engine)
    start = datetime.now(UTC)
    rids = [_rid() for _ in range(5)]
    for i, rid in enumerate(rids):  # five audited requests: 3 ok, 2 failed
        body = {"name": "x"} if i % 2 else {"spec": {"kind": "nope"}}
        client.post("/v1/spec/validate", json=body, headers={**project.headers, **rid})
    client.post("/v1/jobs", json={}, headers={**project.headers, **_rid()})  # failed jobs_create

    everything = _list(client, project, limit=500)["items"]
    assert len(everything) == 6
    ids = [e["id"] for e in everything]
    assert ids == sorted(ids, reverse=True)

    seen, cursor = [], None
    while True:
        page = _list(client, project, limit=2, **({"cursor": cursor} if cursor else {}))
        assert len(page["items"]) <= 2
        seen += [e["id"] for e in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids

    validations = _list(client, project, operation="spec_validate")["items"]
    assert [e["request_id"] for e in validations] == [r["X-Request-ID"] for r in reversed(rids)]
    outcomes = {e["outcome"] for e in everything}
    for outcome in outcomes:
        got = _list(client, project, outcome=outcome)["items"]
        assert got == [e for e in everything if e["outcome"] == outcome]
    assert _list(client, project, actor="default")["items"] == everything
    assert _list(client, project, actor="someone-else")["items"] == []
    assert _list(client, project, since=start.isoformat())["items"] == everything
    later = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    assert _list(client, project, since=later)["items"] == []
    assert _list(client, project, until=start.isoformat())["items"] == []


def test_a_nul_in_the_path_is_still_audited(
    client: TestClient, project: ProjectKey, engine: Engine
) -> None:
    rid = _rid()
    answer = client.post("/v1/jobs/%00/cancel", headers={**project.headers, **rid})
    assert answer.status_code in (404, 422)
    [row] = _rows(engine, rid["X-Request-ID"])
    assert row.path == "/v1/jobs/\N{REPLACEMENT CHARACTER}/cancel"
    assert (row.project_id, row.outcome) == (project.project_id, "failed")


def test_a_target_filter_finds_a_jobs_history(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    job = submit(client, project, job_spec(dataset["id"]))
    client.post(f"/v1/jobs/{job['id']}/cancel", headers=project.headers)
    got = _list(client, project, target=str(job["id"]))["items"]
    assert [e["operation"] for e in got] == ["jobs_cancel", "jobs_create"]


def test_bad_filters_and_cursors_are_422(client: TestClient, project: ProjectKey) -> None:
    for params, loc in [
        ({"cursor": "not-a-cursor"}, ["query", "cursor"]),
        ({"outcome": "maybe"}, ["query", "outcome"]),
        ({"since": "yesterday"}, ["query", "since"]),
        ({"limit": 0}, ["query", "limit"]),
        ({"actor": "a\x00b"}, ["query", "actor"]),
    ]:
        answer = client.get("/v1/audit", params=params, headers=project.headers)
        assert_error(answer, 422, "validation_error", loc)


def test_another_projects_events_are_never_visible(
    client: TestClient, project: ProjectKey, other_project: ProjectKey, dataset: dict[str, Any]
) -> None:
    job = submit(client, project, job_spec(dataset["id"]))
    assert _list(client, project, target=str(job["id"]))["items"]
    assert _list(client, other_project, target=str(job["id"]))["items"] == []
    theirs = _list(client, other_project, limit=500)["items"]
    assert theirs == [], theirs  # the other project made no requests of its own


def test_an_audit_outage_does_not_fail_the_request(
    client: TestClient, project: ProjectKey, engine: Engine, dataset: dict[str, Any]
) -> None:
    rid = _rid()
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE audit_events RENAME TO audit_events_offline"))
    try:
        job = submit(client, project, job_spec(dataset["id"]), **rid)
    finally:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE audit_events_offline RENAME TO audit_events"))
    assert client.get(f"/v1/jobs/{job['id']}", headers=project.headers).status_code == 200
    assert _rows(engine, rid["X-Request-ID"]) == []  # lost, and logged


@pytest.fixture(scope="module")
def proxied(settings: Settings) -> Iterator[TestClient]:
    """The API behind one trusted reverse proxy."""
    with TestClient(create_app(settings.model_copy(update={"trusted_proxies": 1}))) as client:
        yield client


def test_forwarded_for_counts_only_behind_trusted_proxies(
    client: TestClient, proxied: TestClient, project: ProjectKey, engine: Engine
) -> None:
    forwarded = {"X-Forwarded-For": "203.0.113.9, 198.51.100.7"}
    direct, behind = _rid(), _rid()
    client.post("/v1/spec/validate", json={}, headers={**project.headers, **forwarded, **direct})
    proxied.post("/v1/spec/validate", json={}, headers={**project.headers, **forwarded, **behind})
    assert [r.source for r in _rows(engine, direct["X-Request-ID"])] == ["testclient"]
    # one trusted proxy appended the last entry: the address it saw
    assert [r.source for r in _rows(engine, behind["X-Request-ID"])] == ["198.51.100.7"]


@pytest.fixture(scope="module")
def sso_client(settings: Settings, engine: Engine) -> Iterator[tuple[TestClient, Provider, str]]:
    project = make_project(engine)
    provider = Provider(keys=[rsa_key()])
    with serve(provider):
        roles = {
            "viewers": OidcGrant(project=project.project_name, role="viewer"),
            "admins": OidcGrant(project=project.project_name, role="admin"),
        }
        update = {"oidc_issuer": provider.issuer, "oidc_audience": AUDIENCE}
        app = create_app(settings.model_copy(update={**update, "oidc_group_roles": roles}))
        with TestClient(app) as client:
            yield client, provider, project.project_id


def test_a_viewers_refusal_is_audited_with_its_oidc_identity(
    sso_client: tuple[TestClient, Provider, str], engine: Engine
) -> None:
    client, provider, project_id = sso_client
    rid = _rid()
    viewer = {"Authorization": f"Bearer {provider.token(groups=['viewers'], sub='vic')}", **rid}
    assert_error(client.get("/v1/audit", headers=viewer), 403, "forbidden")
    [row] = _rows(engine, rid["X-Request-ID"])
    assert (row.project_id, row.actor, row.actor_kind) == (project_id, "vic", "oidc")
    assert (row.key_id, row.operation, row.outcome) == ("oidc:vic", "audit_list", "denied")

    admin = {"Authorization": f"Bearer {provider.token(groups=['admins'], sub='ada')}"}
    listed = client.get("/v1/audit", params={"actor": "vic"}, headers=admin)
    assert listed.status_code == 200, listed.text
    assert [e["request_id"] for e in listed.json()["items"]] == [rid["X-Request-ID"]]


def test_a_real_uvicorn_server_audits_after_answering(
    live_api: str, project: ProjectKey, engine: Engine
) -> None:
    """Under uvicorn the row is written after the answer: poll for it with a deadline."""
    rid = _rid()
    answer = httpx.post(
        f"{live_api}/v1/spec/validate", json={}, headers={**project.headers, **rid}, timeout=30
    )
    assert answer.headers["x-request-id"] == rid["X-Request-ID"]
    deadline = time.monotonic() + 30
    while not (rows := _rows(engine, rid["X-Request-ID"])) and time.monotonic() < deadline:
        time.sleep(0.05)
    [row] = rows
    assert (row.project_id, row.actor_kind, row.operation) == (
        project.project_id,
        "key",
        "spec_validate",
    )
    assert row.source == "127.0.0.1"
