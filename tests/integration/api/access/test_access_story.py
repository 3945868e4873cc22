"""Issue 14's story, the access part: an organisation admin creates a project; its admin
invites a viewer and a member and gives a CI service account a `jobs:write` key; CI submits,
the member controls the job, and the viewer reads everything and changes nothing."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.integration.api.conftest import assert_error, job_spec
from tests.integration.org_roles import created, set_up_project


def test_an_org_admin_sets_up_a_project_whose_roles_hold(
    client: TestClient, engine: Engine, corpus_dir: Path
) -> None:
    cast = set_up_project(client, engine)
    viewer, member, ci = cast.viewer.headers, cast.member.headers, cast.ci.headers

    dataset = created(
        client.post("/v1/datasets", json={"name": "c", "uri": str(corpus_dir)}, headers=member)
    )
    job = created(client.post("/v1/jobs", json=job_spec(dataset["id"]), headers=ci))
    assert_error(client.get(f"/v1/jobs/{job['id']}", headers=ci), 403, "forbidden")  # write-only

    seen = client.get(f"/v1/jobs/{job['id']}", headers=viewer)
    assert seen.status_code == 200 and seen.json()["state"] == "queued"
    assert client.get("/v1/datasets", headers=viewer).json()["items"][0]["id"] == dataset["id"]
    assert_error(client.post(f"/v1/jobs/{job['id']}/cancel", headers=viewer), 403, "forbidden")
    assert_error(client.get("/v1/keys", headers=member), 403, "forbidden")  # not an admin

    cancelled = client.post(f"/v1/jobs/{job['id']}/cancel", headers=member)
    assert cancelled.status_code == 202, cancelled.text
    # Nothing of the new project is visible from the organisation admin's home project.
    assert_error(client.get(f"/v1/jobs/{job['id']}", headers=cast.org.headers), 404, "not_found")
