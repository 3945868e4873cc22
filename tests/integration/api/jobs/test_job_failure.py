"""A failed job says why in the API: `failure` (class, reason, where, log tail), the restart
counters and `retry_policy` (issue 12: "shown in the API"), to its own project only."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from core.platform.tables import JobState
from jobspec.job import JobSpec
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, job_spec
from tests.integration.failures import INFRA, OOM, RETRIES, fail_job
from tests.integration.workers.helpers import create_job


@pytest.fixture
def failed_job(engine: Engine, project: ProjectKey, dataset: dict[str, Any]) -> int:
    """A job whose attempt 3 failed of OOM after two infra restarts."""
    spec = JobSpec.model_validate(job_spec(dataset["id"], retries=RETRIES))
    job_id = create_job(engine, project, spec)
    fail_job(engine, job_id, OOM, restarts_by_class={"infra": 2})
    return job_id


def test_a_failed_job_carries_its_failure_counters_and_budget(
    client: TestClient, project: ProjectKey, failed_job: int
) -> None:
    job = client.get(f"/v1/jobs/{failed_job}", headers=project.headers).json()
    assert job["state"] == "failed"
    assert job["failure"] == {
        "failure_class": "oom",
        "reason": OOM.reason,
        "rank": 3,
        "node_rank": 1,
        "host": "host-b",
        "exit_code": 1,
        "log_tail": list(OOM.log_tail),
        "hints": [],
    }
    assert (job["restarts_used"], job["restarts_by_class"]) == (2, {"infra": 2})
    policy = job["retry_policy"]
    assert (policy["cap"], policy["used"], policy["left"]) == (3, 2, 1)
    assert policy["by_class"] == {
        "oom": {"allowed": 0, "used": 0, "left": 0},
        "hang": {"allowed": 2, "used": 0, "left": 1},  # the cap leaves 1 of hang's 2
        "node_lost": {"allowed": 0, "used": 0, "left": 0},
        "user_error": {"allowed": 0, "used": 0, "left": 0},
        "infra": {"allowed": 3, "used": 2, "left": 1},
    }
    assert policy["summary"] == (
        "restarted 2 times (hang 0/2, infra 2/3, at most 3 in all); oom is not restarted (budget 0)"
    )


def test_the_list_leaves_the_log_tail_out_and_keeps_the_rest(
    client: TestClient, project: ProjectKey, failed_job: int
) -> None:
    [listed] = client.get("/v1/jobs", headers=project.headers).json()["items"]
    one = client.get(f"/v1/jobs/{failed_job}", headers=project.headers).json()
    assert listed["failure"]["log_tail"] is None
    assert listed["failure"] == {**one["failure"], "log_tail": None}
    assert listed["retry_policy"] == one["retry_policy"]


def test_a_restarted_job_keeps_its_last_failure_and_the_summary_says_no_verdict(
    client: TestClient, engine: Engine, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    spec = JobSpec.model_validate(job_spec(dataset["id"], retries=RETRIES))
    job_id = create_job(engine, project, spec)
    fail_job(engine, job_id, INFRA, state=JobState.RUNNING, restarts_by_class={"infra": 1})
    job = client.get(f"/v1/jobs/{job_id}", headers=project.headers).json()
    assert (job["state"], job["failure"]["failure_class"]) == ("running", "infra")
    summary = job["retry_policy"]["summary"]
    assert summary == "restarted once (hang 0/2, infra 1/3, at most 3 in all)"


def test_a_job_that_never_failed_has_no_failure_and_a_full_budget(
    client: TestClient, engine: Engine, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    job_id = create_job(engine, project, JobSpec.model_validate(job_spec(dataset["id"])))
    job = client.get(f"/v1/jobs/{job_id}", headers=project.headers).json()
    assert (job["failure"], job["restarts_used"], job["restarts_by_class"]) == (None, 0, {})
    assert job["retry_policy"]["summary"] == "no restarts allowed (the spec's `retries`)"


def test_another_projects_key_sees_404_not_the_failure(
    client: TestClient, project: ProjectKey, other_project: ProjectKey, failed_job: int
) -> None:
    theirs = client.get(f"/v1/jobs/{failed_job}", headers=other_project.headers)
    error = assert_error(theirs, 404, "not_found")
    assert OOM.reason not in theirs.text and "host-b" not in error["message"]
    assert client.get("/v1/jobs", headers=other_project.headers).json()["items"] == []


def test_the_openapi_document_types_and_describes_the_failure_fields(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    failure = schemas["Failure"]
    assert failure["properties"]["failure_class"]["$ref"].endswith("/FailureClass")
    assert set(schemas["FailureClass"]["enum"]) == {
        "oom", "hang", "node_lost", "user_error", "infra", "preempted",
    }  # fmt: skip
    job = schemas["Job"]["properties"]
    for name in ("failure", "restarts_used", "restarts_by_class", "retry_policy"):
        assert job[name].get("description"), name
    for model in ("Failure", "RetryPolicy", "ClassBudget"):
        for name, field in schemas[model]["properties"].items():
            assert field.get("description"), f"{model}.{name}"
