"""Issue 14's cast, set up over REST as an organisation does it: an organisation admin creates a
project; the project's admin invites a viewer and a member and gives a CI service account a key
scoped to `jobs:write` only. Shared by the access story (tests/integration/api) and the whole
story with workers and webhooks (tests/integration/workers/test_org_story.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from core.access import auth
from core.platform.db import session_scope
from tests.conftest import ProjectKey, make_project


def created(answer: Any) -> Any:
    """The body of a 201 answer (the test fails with the answer's text otherwise)."""
    assert answer.status_code == 201, answer.text
    return answer.json()


@dataclass(frozen=True)
class Cast:
    """The keys of each role. `org`: the organisation admin's (its home project is another
    one); the others act in the new project. The viewer's, member's and CI's keys are named
    after their role (`viewer`, `member`, `ci`): audit rows name them."""

    org: ProjectKey
    admin: ProjectKey
    viewer: ProjectKey
    member: ProjectKey
    ci: ProjectKey

    @property
    def project_id(self) -> str:
        return self.admin.project_id


def set_up_project(client: TestClient, engine: Engine) -> Cast:
    """A new project made over REST by an organisation admin (whose own key is the only one
    made in the database), with a viewer, a member and a CI service account of its admin's."""
    home = make_project(engine)
    with session_scope(engine) as s:
        org_secret = auth.create_api_key(
            session=s, project_id=home.project_id, name="org-admin", org_admin=True
        )
    org = ProjectKey(home.project_id, home.project_name, org_secret)
    name = f"vision-{home.project_id[-8:]}"
    project = created(client.post("/v1/projects", json={"name": name}, headers=org.headers))
    project_id = project["project"]["id"]
    admin = ProjectKey(project_id, name, project["key"]["secret"])

    def key_for(path: str, body: dict[str, Any], key_name: str, **key: Any) -> ProjectKey:
        owner = created(client.post(path, json=body, headers=admin.headers))
        field = "member_id" if path == "/v1/members" else "service_account_id"
        made = created(
            client.post(
                "/v1/keys",
                json={"name": key_name, field: owner["id"], **key},
                headers=admin.headers,
            )
        )
        return ProjectKey(project_id, name, made["secret"])

    return Cast(
        org=org,
        admin=admin,
        viewer=key_for("/v1/members", {"subject": "vi@example.com", "role": "viewer"}, "viewer"),
        member=key_for("/v1/members", {"subject": "me@example.com", "role": "member"}, "member"),
        ci=key_for(
            "/v1/service-accounts", {"name": "ci", "role": "member"}, "ci", scopes=["jobs:write"]
        ),
    )
