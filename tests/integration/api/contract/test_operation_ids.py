"""OpenAPI `operationId`s are stable and readable: `<tag>_<action>`, unique, every route tagged."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.openapi_ids import operation_id

_ID = re.compile(r"^[a-z]+(_[a-z0-9]+)+$")
_METHODS = {"get", "post", "put", "patch", "delete"}

MAIN_IDS = {
    ("post", "/v1/jobs"): "jobs_create",
    ("get", "/v1/jobs"): "jobs_list",
    ("get", "/v1/jobs/{job_id}"): "jobs_get",
    ("patch", "/v1/jobs/{job_id}"): "jobs_update",
    ("post", "/v1/jobs/{job_id}/cancel"): "jobs_cancel",
    ("post", "/v1/jobs/{job_id}/pause"): "jobs_pause",
    ("post", "/v1/jobs/{job_id}/resume"): "jobs_resume",
    ("post", "/v1/jobs/{job_id}/retry"): "jobs_retry",
    ("get", "/v1/jobs/{job_id}/metrics"): "job_data_metrics",
    ("get", "/v1/jobs/{job_id}/logs"): "job_data_logs",
    ("get", "/v1/datasets"): "datasets_list",
    ("post", "/v1/datasets"): "datasets_register",
    ("post", "/v1/datasets/upload"): "datasets_upload",
    ("get", "/v1/datasets/{dataset_id}"): "datasets_get",
    ("post", "/v1/code"): "code_create",
    ("get", "/v1/code"): "code_list",
    ("get", "/v1/code/{code_id}"): "code_get",
    ("post", "/v1/spec/validate"): "spec_validate",
    ("get", "/v1/me"): "me_get",
    ("get", "/healthz"): "health_live",
    ("get", "/readyz"): "health_ready",
    ("post", "/openai/v1/files"): "openai_files_create",
    ("post", "/openai/v1/fine_tuning/jobs"): "openai_fine_tuning_jobs_create",
    ("get", "/openai/v1/fine_tuning/jobs/{job_id}"): "openai_fine_tuning_jobs_retrieve",
}


def _operations(client: TestClient) -> dict[tuple[str, str], dict[str, Any]]:
    paths = client.get("/openapi.json").json()["paths"]
    return {
        (method, path): operation
        for path, item in paths.items()
        for method, operation in item.items()
        if method in _METHODS
    }


def test_every_operation_id_is_unique_readable_and_tagged(client: TestClient) -> None:
    operations = _operations(client)
    assert len(operations) >= len(MAIN_IDS)
    ids = [operation["operationId"] for operation in operations.values()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    unreadable = sorted(i for i in ids if not _ID.fullmatch(i))
    assert not unreadable
    untagged = sorted(key for key, operation in operations.items() if not operation.get("tags"))
    assert not untagged


def test_main_operations_have_their_fixed_ids(client: TestClient) -> None:
    operations = _operations(client)
    got = {key: operations[key]["operationId"] for key in MAIN_IDS if key in operations}
    assert got == MAIN_IDS


def test_ids_lead_with_the_routes_tag(client: TestClient) -> None:
    for (method, path), operation in _operations(client).items():
        tag = re.sub(r"[^a-z0-9]+", "_", operation["tags"][0].lower())
        assert operation["operationId"].startswith(f"{tag}_"), (method, path, operation)


def test_a_documented_route_without_a_tag_is_refused() -> None:
    app = FastAPI(generate_unique_id_function=operation_id)
    with pytest.raises(ValueError, match="/untagged has no tag"):
        app.add_api_route("/untagged", lambda: None)
    app.add_api_route("/hidden", lambda: None, include_in_schema=False)  # hidden: no tag needed
