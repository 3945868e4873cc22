"""Every `/v1` resource needs a valid, unrevoked API key; `/v1/me` says whose it is."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update

from core.platform.db import session_scope
from core.platform.tables import ApiKey, utcnow
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error

PROTECTED = [
    ("get", "/v1/me"),
    ("get", "/v1/jobs"),
    ("post", "/v1/jobs"),
    ("get", "/v1/jobs/1"),
    ("post", "/v1/jobs/1/cancel"),
    ("get", "/v1/jobs/1/events"),
    ("get", "/v1/jobs/1/metrics"),
    ("get", "/v1/jobs/1/logs"),
    ("get", "/v1/jobs/1/checkpoints"),
    ("post", "/v1/jobs/1/checkpoints/1/export"),
    ("get", "/v1/jobs/1/checkpoints/1/export"),
    ("get", "/v1/jobs/1/checkpoints/1/export/download"),
    ("get", "/v1/datasets"),
    ("post", "/v1/datasets"),
    ("post", "/v1/datasets/upload"),
    ("get", "/v1/datasets/ds_1"),
    ("post", "/v1/datasets/ds_1/preview"),
    ("get", "/v1/code"),
    ("post", "/v1/code"),
    ("get", "/v1/code/code_0000000000000000"),
]


def test_me_names_the_project_and_key(client: TestClient, project: ProjectKey) -> None:
    answer = client.get("/v1/me", headers=project.headers)
    assert answer.status_code == 200
    body = answer.json()
    assert body["project"] == {"id": project.project_id, "name": project.project_name}
    assert body["key"]["prefix"] == project.api_key[:10]
    assert set(body["key"]) == {"id", "name", "prefix"}
    # A key made by `create_api_key` (as before roles existed): admin, every scope.
    assert body["role"] == "admin" and body["org_admin"] is False
    assert body["scopes"] == ["jobs:read", "jobs:write", "datasets:write", "admin"]


@pytest.mark.parametrize(("method", "path"), PROTECTED)
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer ty_not-a-real-key", "Basic dXNlcjpwYXNz", "Bearer ", "ty_no-scheme"],
    ids=["missing", "unknown", "basic", "empty", "no_scheme"],
)
def test_without_a_valid_key_every_resource_is_401(
    client: TestClient, method: str, path: str, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    answer = client.request(method, path, headers=headers)
    assert_error(answer, 401, "unauthorized")
    assert answer.headers["www-authenticate"] == "Bearer"


def test_a_revoked_key_is_401(client: TestClient, project: ProjectKey, engine: Engine) -> None:
    assert client.get("/v1/me", headers=project.headers).status_code == 200
    with session_scope(engine) as s:
        s.execute(
            update(ApiKey)
            .where(ApiKey.project_id == project.project_id)
            .values(revoked_at=utcnow())
        )
    error = assert_error(client.get("/v1/me", headers=project.headers), 401, "unauthorized")
    assert "revoked" in error["message"]
    assert_error(client.get("/v1/jobs", headers=project.headers), 401, "unauthorized")


def test_probes_and_schema_need_no_key(client: TestClient) -> None:
    for path in ("/healthz", "/readyz", "/v1/spec/schema", "/openapi.json"):
        assert client.get(path).status_code == 200, path
