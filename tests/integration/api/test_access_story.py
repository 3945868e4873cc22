"""Issue 14's story, the access part: an organisation admin creates a project; its admin
invites a viewer and a member and gives a CI service account a `jobs:write` key; CI submits,
the member controls the job, and the viewer reads everything and changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from core import auth
from core.db import session_scope
from tests.conftest import make_project
from tests.integration.api.conftest import assert_error, job_spec


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _created(answer: Any) -> Any:
    assert answer.status_code == 201, answer.text
    return answer.json()


def test_an_org_admin_sets_up_a_project_whose_roles_hold(
    client: TestClient, engine: Engine, corpus_dir: Path
) -> None:
    home = make_project(engine)
    with session_scope(engine) as s:
        org = _bearer(auth.create_api_key(session=s, project_id=home.project_id, org_admin=True))
    name = f"vision-{home.project_id[-8:]}"
    project = _created(client.post("/v1/projects", json={"name": name}, headers=org))
    admin = _bearer(project["key"]["secret"])

    def key_for(path: str, body: dict[str, Any], **key: Any) -> dict[str, str]:
        owner = _created(client.post(path, json=body, headers=admin))
        field = "member_id" if path == "/v1/members" else "service_account_id"
        made = _created(
            client.post("/v1/keys", json={"name": "k", field: owner["id"], **key}, headers=admin)
        )
        return _bearer(made["secret"])

    viewer = key_for("/v1/members", {"subject": "vi@example.com", "role": "viewer"})
    member = key_for("/v1/members", {"subject": "me@example.com", "role": "member"})
    ci = key_for("/v1/service-accounts", {"name": "ci", "role": "member"}, scopes=["jobs:write"])

    dataset = _created(
        client.post("/v1/datasets", json={"name": "c", "uri": str(corpus_dir)}, headers=member)
    )
    job = _created(client.post("/v1/jobs", json=job_spec(dataset["id"]), headers=ci))
    assert_error(client.get(f"/v1/jobs/{job['id']}", headers=ci), 403, "forbidden")  # write-only

    seen = client.get(f"/v1/jobs/{job['id']}", headers=viewer)
    assert seen.status_code == 200 and seen.json()["state"] == "queued"
    assert client.get("/v1/datasets", headers=viewer).json()["items"][0]["id"] == dataset["id"]
    assert_error(client.post(f"/v1/jobs/{job['id']}/cancel", headers=viewer), 403, "forbidden")
    assert_error(client.get("/v1/keys", headers=member), 403, "forbidden")  # not an admin

    cancelled = client.post(f"/v1/jobs/{job['id']}/cancel", headers=member)
    assert cancelled.status_code == 202, cancelled.text
    # Nothing of the new project is visible from the organisation admin's home project.
    assert_error(client.get(f"/v1/jobs/{job['id']}", headers=org), 404, "not_found")
