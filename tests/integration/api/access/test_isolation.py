"""A key sees only its own project: another project's ids are 404, exactly like unknown ids."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.conftest import ProjectKey
from tests.integration.api.code_archives import code_files, tar_gz, upload
from tests.integration.api.conftest import JOB_ENDPOINTS, assert_error, counts, job_spec, submit


@pytest.mark.parametrize(("method", "suffix"), JOB_ENDPOINTS)
def test_another_projects_job_is_404_like_an_unknown_one(
    client: TestClient,
    project: ProjectKey,
    other_project: ProjectKey,
    dataset: dict[str, Any],
    method: str,
    suffix: str,
) -> None:
    job = submit(client, project, job_spec(dataset["id"]))
    theirs = client.request(method, f"/v1/jobs/{job['id']}{suffix}", headers=other_project.headers)
    error = assert_error(theirs, 404, "not_found")
    assert error["message"] == f"job {job['id']} not found"
    # ... and it was not touched: still queued for its owner
    mine = client.get(f"/v1/jobs/{job['id']}", headers=project.headers).json()
    assert mine["state"] == "queued"


def test_another_projects_dataset_is_404_like_an_unknown_one(
    client: TestClient, other_project: ProjectKey, dataset: dict[str, Any]
) -> None:
    theirs = client.get(f"/v1/datasets/{dataset['id']}", headers=other_project.headers)
    error = assert_error(theirs, 404, "not_found")
    preview = client.post(
        f"/v1/datasets/{dataset['id']}/preview", json={}, headers=other_project.headers
    )
    assert assert_error(preview, 404, "not_found")["message"] == error["message"]
    unknown = client.get("/v1/datasets/ds_0000000000000000", headers=other_project.headers)
    assert error["message"].replace(dataset["id"], "X") == (
        unknown.json()["error"]["message"].replace("ds_0000000000000000", "X")
    )


def test_lists_show_only_the_callers_rows(
    client: TestClient,
    project: ProjectKey,
    other_project: ProjectKey,
    dataset: dict[str, Any],
) -> None:
    # The other project owns a dataset and a job too, so its lists cannot pass by being empty.
    their_dataset = client.post(
        "/v1/datasets",
        json={"name": "corpus", "uri": dataset["uri"]},
        headers=other_project.headers,
    ).json()
    theirs = submit(client, other_project, job_spec(their_dataset["id"]))
    job = submit(client, project, job_spec(dataset["id"]))
    their_jobs = client.get("/v1/jobs", headers=other_project.headers).json()["items"]
    assert [j["id"] for j in their_jobs] == [theirs["id"]]  # their own job, not ours
    assert job["id"] not in [j["id"] for j in their_jobs]
    assert their_jobs[0]["project_id"] == other_project.project_id
    their_datasets = client.get("/v1/datasets", headers=other_project.headers).json()["items"]
    assert [d["id"] for d in their_datasets] == [their_dataset["id"]]
    mine = client.get("/v1/datasets", headers=project.headers).json()["items"]
    assert [d["id"] for d in mine] == [dataset["id"]]


def test_a_job_cannot_use_another_projects_dataset(
    client: TestClient,
    other_project: ProjectKey,
    dataset: dict[str, Any],
    engine: Engine,
) -> None:
    before = counts(engine, other_project.project_id)
    answer = client.post("/v1/jobs", json=job_spec(dataset["id"]), headers=other_project.headers)
    assert_error(answer, 422, "validation_error", ["body", "data", "dataset"])
    assert counts(engine, other_project.project_id) == before


def test_a_dataset_name_may_repeat_across_projects(
    client: TestClient, other_project: ProjectKey, dataset: dict[str, Any], corpus_dir: Any
) -> None:
    answer = client.post(
        "/v1/datasets",
        json={"name": dataset["name"], "uri": str(corpus_dir)},
        headers=other_project.headers,
    )
    assert answer.status_code == 201
    assert answer.json()["id"] != dataset["id"]


def test_another_projects_archive_is_404_like_an_unknown_one(
    client: TestClient, project: ProjectKey, other_project: ProjectKey
) -> None:
    archive = upload(client, project, tar_gz(code_files())).json()
    theirs = client.get(f"/v1/code/{archive['id']}", headers=other_project.headers)
    error = assert_error(theirs, 404, "not_found")
    unknown = client.get("/v1/code/code_0000000000000000", headers=other_project.headers)
    assert error["message"].replace(archive["id"], "X") == assert_error(unknown, 404, "not_found")[
        "message"
    ].replace("code_0000000000000000", "X")
    assert client.get("/v1/code", headers=other_project.headers).json() == {"items": []}
    assert_error(client.get("/v1/code/%00", headers=project.headers), 404, "not_found")
