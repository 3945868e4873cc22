"""`POST /v1/spec/validate`: a YAML (or JSON) spec checked as `POST /v1/jobs` would check it,
each error placed at the line of its field (what the dashboard's editor shows)."""

from __future__ import annotations

from typing import Any

import httpx
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.conftest import ProjectKey
from tests.integration.api.conftest import counts

YAML = {"Content-Type": "application/yaml"}


def _spec_text(dataset_id: str, pool: str, micro_batch_size: int = 4) -> str:
    return f"""\
name: yaml-run
data:
  dataset: {dataset_id}
optim:
  lr: 3e-4
train:
  micro_batch_size: {micro_batch_size}
  max_steps: 20
eval:
  interval_steps: 10
resources:
  pool: {pool}
"""


def _details(answer: httpx.Response, status: int) -> dict[str, dict[str, Any]]:
    """The error's details by dotted loc, each with the contract's keys plus line and column."""
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == {422: "validation_error", 403: "forbidden"}[status]
    for d in error["details"]:
        assert set(d) == {"loc", "msg", "type", "line", "column"}, d
    return {".".join(map(str, d["loc"])): d for d in error["details"]}


def test_a_valid_yaml_spec_comes_back_as_the_json_body_jobs_accepts_with_its_lines(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str, engine: Engine
) -> None:
    text = _spec_text(dataset["id"], pool)
    before = counts(engine, project.project_id)
    answer = client.post("/v1/spec/validate", content=text, headers={**project.headers, **YAML})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["spec"]["optim"] == {"lr": 3e-4}  # a float, as YAML 1.2 and JSON read it
    assert body["lines"]["/train/micro_batch_size"] == 7
    assert body["lines"]["/resources/pool"] == 12
    assert counts(engine, project.project_id) == before  # checked, not submitted
    submitted = client.post("/v1/jobs", json=body["spec"], headers=project.headers)
    assert submitted.status_code == 201, submitted.text
    assert submitted.json()["spec"]["optim"]["lr"] == 3e-4


def test_field_errors_carry_the_same_json_paths_as_jobs_and_the_lines_they_concern(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str
) -> None:
    text = _spec_text(dataset["id"], pool, micro_batch_size=0) + "nonsense: 1\n"
    answer = client.post("/v1/spec/validate", content=text, headers={**project.headers, **YAML})
    details = _details(answer, 422)
    assert details["body.train.micro_batch_size"]["line"] == 7
    assert details["body.train.micro_batch_size"]["column"] == 3
    assert details["body.nonsense"]["line"] == 13
    # POST /v1/jobs names the same paths for the same spec sent as JSON.
    from_jobs = client.post("/v1/jobs", json=yaml.safe_load(text), headers=project.headers)
    paths = {".".join(map(str, d["loc"])) for d in from_jobs.json()["error"]["details"]}
    assert paths == set(details)


def test_cross_field_and_project_checks_are_placed_too(
    client: TestClient, project: ProjectKey, pool: str
) -> None:
    text = _spec_text("ds_not_there", pool).replace("optim:", "model:\n  n_heads: 3\noptim:")
    answer = client.post("/v1/spec/validate", content=text, headers={**project.headers, **YAML})
    assert _details(answer, 422)["body.model.n_heads"]["line"] == 5
    fixed = text.replace("n_heads: 3", "n_heads: 2")
    answer = client.post("/v1/spec/validate", content=fixed, headers={**project.headers, **YAML})
    assert _details(answer, 422)["body.data.dataset"]["line"] == 3  # not in this project


def test_a_yaml_syntax_error_is_422_at_its_line_and_a_missing_key_is_401(
    client: TestClient, project: ProjectKey
) -> None:
    answer = client.post(
        "/v1/spec/validate", content="name: x\ndata: {dataset: [\n", headers=project.headers
    )
    (detail,) = _details(answer, 422).values()
    assert detail["loc"] == ["body"] and detail["line"] == 3, detail
    assert "not YAML" in detail["msg"]
    answer = client.post("/v1/spec/validate", content=b"name: \xff\n", headers=project.headers)
    assert answer.status_code == 422 and answer.json()["error"]["details"][0]["loc"] == ["body"]
    assert client.post("/v1/spec/validate", content="name: x").status_code == 401
