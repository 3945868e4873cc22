"""The app as a whole: probes, OpenAPI, the migration check, and errors outside any route."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.main import create_app
from core.platform.control import STALE_AFTER_S, record_round
from core.platform.db import SchemaNotMigrated, make_engine, upgrade
from core.platform.settings import Settings
from tests.conftest import REPO_ROOT, ProjectKey, settings_env
from tests.integration.api.conftest import assert_error

ROUTES = {
    ("get", "/v1/me"),
    ("post", "/v1/jobs"),
    ("get", "/v1/jobs"),
    ("get", "/v1/jobs/{job_id}"),
    ("post", "/v1/jobs/{job_id}/cancel"),
    ("get", "/v1/jobs/{job_id}/events"),
    ("get", "/v1/jobs/{job_id}/metrics"),
    ("get", "/v1/jobs/{job_id}/logs"),
    ("get", "/v1/jobs/{job_id}/checkpoints"),
    ("post", "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/export"),
    ("get", "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/export"),
    ("get", "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/export/download"),
    ("post", "/v1/datasets"),
    ("post", "/v1/datasets/upload"),
    ("get", "/v1/datasets"),
    ("get", "/v1/datasets/{dataset_id}"),
    ("post", "/v1/datasets/{dataset_id}/preview"),
    ("post", "/v1/code"),
    ("get", "/v1/code"),
    ("get", "/v1/code/{code_id}"),
    ("get", "/v1/spec/schema"),
    ("get", "/healthz"),
    ("get", "/readyz"),
}


def _unmigrated_settings(tmp_path: Path) -> Settings:
    db = tmp_path / "empty.db"
    sqlite3.connect(db).close()
    return Settings(env="test", home=tmp_path, database_url=f"sqlite:///{db}")


def test_healthz_and_readyz_answer_200_on_a_migrated_database(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    answer = client.get("/readyz")
    assert answer.status_code == 200
    assert answer.json()["reconciler"]["state"] in ("ok", "stale", "absent")


def _readyz_with(tmp_path: Path, reconciled_s_ago: float | None) -> dict[str, Any]:
    """`/readyz` over a fresh SQLite database whose one controller last reconciled this many
    seconds ago (None: no controller row)."""
    url = f"sqlite:///{tmp_path / 'ready.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        if reconciled_s_ago is not None:
            at = datetime.now(UTC) - timedelta(seconds=reconciled_s_ago)
            with Session(engine) as session:
                record_round(
                    session,
                    name="ctl-0:41",
                    host="ctl-0",
                    pid=41,
                    started_at=at,
                    leading=True,
                    reconciled=True,
                    now=at,
                )
    finally:
        engine.dispose()
    settings = Settings(env="test", home=tmp_path, database_url=url)
    with TestClient(create_app(settings), raise_server_exceptions=True) as client:
        answer = client.get("/readyz")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_readyz_is_ok_while_a_controller_reconciled_within_five_rounds(tmp_path: Path) -> None:
    body = _readyz_with(tmp_path, reconciled_s_ago=1.0)
    assert body["status"] == "ok"
    reconciler = body["reconciler"]
    assert (reconciler["state"], reconciler["leader"]) == ("ok", "ctl-0:41")
    assert 1.0 <= reconciler["seconds_since"] < STALE_AFTER_S


def test_readyz_says_degraded_when_the_last_reconcile_is_older_than_five_rounds(
    tmp_path: Path,
) -> None:
    body = _readyz_with(tmp_path, reconciled_s_ago=STALE_AFTER_S + 30)
    assert body["status"] == "degraded"
    reconciler = body["reconciler"]
    assert reconciler["state"] == "stale"
    assert reconciler["seconds_since"] >= STALE_AFTER_S + 30
    assert "torchyard controller" in reconciler["detail"]


def test_readyz_says_degraded_when_no_controller_ever_reconciled(tmp_path: Path) -> None:
    body = _readyz_with(tmp_path, reconciled_s_ago=None)
    assert body["status"] == "degraded"
    assert body["reconciler"]["state"] == "absent"
    assert body["reconciler"]["reconciled_at"] is None
    assert "torchyard controller" in body["reconciler"]["detail"]


def test_readyz_is_503_with_the_fix_on_an_unmigrated_database(tmp_path: Path) -> None:
    app = create_app(_unmigrated_settings(tmp_path))
    client = TestClient(app)  # no lifespan: the startup check would refuse this database
    assert client.get("/healthz").status_code == 200
    error = assert_error(client.get("/readyz"), 503, "unavailable")
    assert "torchyard admin migrate" in error["message"]


def test_startup_refuses_an_unmigrated_database_with_the_command_that_fixes_it(
    tmp_path: Path,
) -> None:
    app = create_app(_unmigrated_settings(tmp_path))
    with pytest.raises(SchemaNotMigrated, match="run `torchyard admin migrate`"), TestClient(app):
        pass


def test_uvicorn_exits_on_an_unmigrated_database_and_says_why(
    tmp_path: Path, settings: Settings
) -> None:
    bad = _unmigrated_settings(tmp_path)
    env = {**settings_env(settings), "TORCHYARD_DATABASE_URL": bad.database_url}
    done = subprocess.run(
        [sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory", "--port", "0"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "refusing to start" in done.stderr
    assert "torchyard admin migrate" in done.stderr


def test_openapi_lists_every_route_with_its_docstring_and_error_body(client: TestClient) -> None:
    answer = client.get("/openapi.json")
    assert answer.status_code == 200
    doc = answer.json()
    found = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert found >= ROUTES
    submit = doc["paths"]["/v1/jobs"]["post"]
    assert submit["description"].startswith("Submit a training job")
    assert "ErrorBody" in doc["components"]["schemas"]
    assert "JobSpec" in doc["components"]["schemas"]
    assert submit["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"
    }
    upload = doc["paths"]["/v1/datasets/upload"]["post"]
    assert "multipart/form-data" in upload["requestBody"]["content"]
    code = doc["paths"]["/v1/code"]["post"]
    assert "multipart/form-data" in code["requestBody"]["content"]
    assert {"200", "201", "413", "422"} <= set(code["responses"])
    assert client.get("/docs").status_code == 200


def test_spec_schema_offers_the_trainer_script_and_eval_kinds(client: TestClient) -> None:
    answer = client.get("/v1/spec/schema")
    assert answer.status_code == 200
    schema = answer.json()
    kinds = {item["$ref"].rsplit("/", 1)[-1] for item in schema["oneOf"]}
    assert kinds == {"JobSpec", "ScriptJobSpec", "EvalJobSpec"}
    assert {"name", "data", "model"} <= set(schema["$defs"]["JobSpec"]["properties"])
    assert {"name", "entrypoint", "resources"} <= set(
        schema["$defs"]["ScriptJobSpec"]["properties"]
    )
    assert {"name", "evaluate", "resources"} <= set(schema["$defs"]["EvalJobSpec"]["properties"])


def test_root_is_the_dashboard_and_the_docs_stay(client: TestClient) -> None:
    answer = client.get("/", follow_redirects=False)
    assert answer.status_code == 307 and answer.headers["location"] == "/ui/"
    page = client.get("/ui/")
    assert page.status_code == 200 and '<main id="view"' in page.text
    assert client.get("/docs").status_code == 200


def test_unknown_route_is_404_in_the_error_shape(client: TestClient) -> None:
    assert_error(client.get("/v1/nope"), 404, "not_found")


def test_wrong_method_is_405_in_the_error_shape(client: TestClient, project: ProjectKey) -> None:
    answer = client.delete("/v1/me", headers=project.headers)
    assert_error(answer, 405, "method_not_allowed")
    assert "GET" in answer.headers["allow"]


def test_json_body_over_the_limit_is_413_by_content_length(
    client: TestClient, project: ProjectKey
) -> None:
    body = b'{"name": "' + b"x" * (2 << 20) + b'"}'
    answer = client.post(
        "/v1/jobs",
        content=body,
        headers={**project.headers, "content-type": "application/json"},
    )
    assert_error(answer, 413, "payload_too_large")


def test_json_body_over_the_limit_is_413_while_streaming(
    client: TestClient, project: ProjectKey
) -> None:
    def chunks():  # no Content-Length: the limit is counted as the body arrives
        yield b'{"name": "'
        for _ in range(40):
            yield b"x" * 65536
        yield b'"}'

    answer = client.post(
        "/v1/jobs",
        content=chunks(),
        headers={**project.headers, "content-type": "application/json"},
    )
    assert_error(answer, 413, "payload_too_large")
