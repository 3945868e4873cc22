"""A script job (`entrypoint`) as the API shows it: `POST /v1/jobs`, `GET /v1/jobs/{id}` and
the jobs list give its spec as the submitted document (entrypoint, none of the trainer's
sections) and `max_steps` 0 (its end is the script's to know); once it was a 500."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.conftest import ProjectKey
from tests.integration.script_jobs import COMMAND, insert_archive, script_spec
from tests.integration.workers.helpers import unique_queue


def test_a_script_jobs_spec_reads_back_as_submitted_with_no_trainer_sections(
    client: TestClient, project: ProjectKey, engine: Engine
) -> None:
    code_id = insert_archive(engine, project.project_id)
    spec = script_spec(code_id, unique_queue("nowhere"))
    created = client.post("/v1/jobs", json=spec, headers=project.headers)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]

    shown = client.get(f"/v1/jobs/{job_id}", headers=project.headers).json()
    listed = client.get("/v1/jobs", headers=project.headers).json()["items"]
    for job in (created.json(), shown, *(j for j in listed if j["id"] == job_id)):
        assert job["spec"]["entrypoint"]["code"] == code_id
        assert job["spec"]["entrypoint"]["command"] == COMMAND
        assert job["spec"]["entrypoint"]["env"] == spec["entrypoint"]["env"]
        assert not {"model", "data", "train", "optim", "method"} & set(job["spec"])
        assert (job["max_steps"], job["current_step"]) == (0, None)
    assert [j["id"] for j in listed] == [job_id]
