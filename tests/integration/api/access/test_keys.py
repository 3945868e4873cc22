"""Members, service accounts and API keys over REST: secrets shown once and stored hashed,
revocation, expiry, role changes and disabled accounts effective on the next request."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, update

from core.platform.db import session_scope
from core.platform.tables import ApiKey
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def post(client: TestClient, project: ProjectKey, path: str, body: dict[str, Any]) -> Any:
    answer = client.post(path, json=body, headers=project.headers)
    assert answer.status_code == 201, answer.text
    return answer.json()


def member_key(client: TestClient, project: ProjectKey, role: str, **key: Any) -> tuple[str, str]:
    """(member id, secret of a new key of a new member with `role`)."""
    member = post(client, project, "/v1/members", {"subject": f"{role}@example.com", "role": role})
    created = post(client, project, "/v1/keys", {"name": role, "member_id": member["id"], **key})
    return member["id"], created["secret"]


def test_a_keys_secret_is_shown_once_and_only_its_sha256_is_stored(
    client: TestClient, project: ProjectKey, engine: Engine
) -> None:
    created = post(client, project, "/v1/keys", {"name": "ci", "scopes": ["jobs:read"]})
    secret = created["secret"]
    assert secret.startswith("ty_") and created["prefix"] == secret[:10]
    with session_scope(engine) as s:
        row = s.execute(select(ApiKey).where(ApiKey.id == created["id"])).scalar_one()
        assert row.key_hash == hashlib.sha256(secret.encode()).hexdigest()
        stored = {c.name: getattr(row, c.key) for c in ApiKey.__table__.columns}
    assert secret not in {str(v) for v in stored.values()}
    listed = client.get("/v1/keys", headers=project.headers)
    assert listed.status_code == 200
    assert secret not in listed.text and row.key_hash not in listed.text
    mine = next(k for k in listed.json()["items"] if k["id"] == created["id"])
    assert "secret" not in mine and "key_hash" not in mine
    assert mine["scopes"] == ["jobs:read"] and mine["role"] == "member"
    assert client.get("/v1/jobs", headers=bearer(secret)).status_code == 200


def test_revocation_is_effective_on_the_next_request(
    client: TestClient, project: ProjectKey
) -> None:
    created = post(client, project, "/v1/keys", {"name": "short-lived"})
    assert client.get("/v1/jobs", headers=bearer(created["secret"])).status_code == 200
    revoked = client.delete(f"/v1/keys/{created['id']}", headers=project.headers)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert_error(client.get("/v1/jobs", headers=bearer(created["secret"])), 401, "unauthorized")


def test_an_expired_key_is_401(client: TestClient, project: ProjectKey, engine: Engine) -> None:
    created = post(client, project, "/v1/keys", {"name": "expiring", "expires_in": 3600})
    assert client.get("/v1/jobs", headers=bearer(created["secret"])).status_code == 200
    with session_scope(engine) as s:  # its hour has passed
        past = datetime.now(UTC) - timedelta(seconds=1)
        s.execute(update(ApiKey).where(ApiKey.id == created["id"]).values(expires_at=past))
    answer = client.get("/v1/jobs", headers=bearer(created["secret"]))
    assert "expired" in assert_error(answer, 401, "unauthorized")["message"]


def test_an_expiry_in_the_past_makes_an_expired_key_and_two_expiries_are_422(
    client: TestClient, project: ProjectKey
) -> None:
    past = post(client, project, "/v1/keys", {"name": "k", "expires_at": "2001-01-01T00:00:00Z"})
    assert past["expires_at"].startswith("2001-01-01")
    assert_error(client.get("/v1/me", headers=bearer(past["secret"])), 401, "unauthorized")
    both = client.post(
        "/v1/keys",
        json={"name": "k", "expires_in": 3600, "expires_at": "2099-01-01T00:00:00Z"},
        headers=project.headers,
    )
    assert "not both" in assert_error(both, 422, "validation_error")["message"]
    null = client.post("/v1/keys", json={"name": "k", "role": None}, headers=project.headers)
    assert_error(null, 422, "validation_error", ["body", "role"])


def test_a_members_role_change_is_effective_on_the_next_request(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    member_id, secret = member_key(client, project, "member")
    body = {"name": "corpus2", "uri": dataset["uri"]}
    assert client.post("/v1/datasets", json=body, headers=bearer(secret)).status_code == 201
    patched = client.patch(
        f"/v1/members/{member_id}", json={"role": "viewer"}, headers=project.headers
    )
    assert patched.status_code == 200 and patched.json()["role"] == "viewer"
    body = {"name": "corpus3", "uri": dataset["uri"]}
    refused = client.post("/v1/datasets", json=body, headers=bearer(secret))
    assert "datasets:write" in assert_error(refused, 403, "forbidden")["message"]
    assert client.get("/v1/datasets", headers=bearer(secret)).status_code == 200  # still reads


def test_a_removed_member_s_keys_are_401(client: TestClient, project: ProjectKey) -> None:
    member_id, secret = member_key(client, project, "viewer")
    assert client.delete(f"/v1/members/{member_id}", headers=project.headers).status_code == 200
    assert_error(client.get("/v1/jobs", headers=bearer(secret)), 401, "unauthorized")
    listed = client.get("/v1/members", headers=project.headers).json()["items"]
    assert member_id not in [m["id"] for m in listed]


def test_a_disabled_service_account_s_keys_are_401(client: TestClient, project: ProjectKey) -> None:
    account = post(client, project, "/v1/service-accounts", {"name": "ci", "role": "member"})
    created = post(
        client,
        project,
        "/v1/keys",
        {"name": "ci", "service_account_id": account["id"], "scopes": ["jobs:write"]},
    )
    assert created["owner"] == {"kind": "service_account", "id": account["id"], "name": "ci"}
    # jobs:write only: it may submit but not read
    assert_error(client.get("/v1/jobs", headers=bearer(created["secret"])), 403, "forbidden")
    me = client.get("/v1/me", headers=bearer(created["secret"])).json()
    assert (me["role"], me["scopes"]) == ("member", ["jobs:write"])
    gone = client.delete(f"/v1/service-accounts/{account['id']}", headers=project.headers)
    assert gone.status_code == 200 and gone.json()["disabled_at"] is not None
    answer = client.get("/v1/me", headers=bearer(created["secret"]))
    assert "disabled" in assert_error(answer, 401, "unauthorized")["message"]


def test_a_key_cannot_hold_more_than_its_owners_role(
    client: TestClient, project: ProjectKey
) -> None:
    member = post(client, project, "/v1/members", {"subject": "v@example.com", "role": "viewer"})
    answer = client.post(
        "/v1/keys",
        json={"name": "k", "member_id": member["id"], "scopes": ["jobs:read", "jobs:write"]},
        headers=project.headers,
    )
    error = assert_error(answer, 403, "forbidden", ["body", "scopes"])  # no escalation
    assert "jobs:write" in error["message"] and "viewer" in error["message"]
    bad_scope = client.post(
        "/v1/keys", json={"name": "k", "scopes": ["root"]}, headers=project.headers
    )
    assert_error(bad_scope, 422, "validation_error", ["body", "scopes", 0])
    bad_role = client.post(
        "/v1/members", json={"subject": "x@example.com", "role": "owner"}, headers=project.headers
    )
    assert_error(bad_role, 422, "validation_error", ["body", "role"])


def test_a_key_without_admin_scope_cannot_mint_an_admin_key(
    client: TestClient, project: ProjectKey
) -> None:
    """An admin's key scoped to `admin` alone can manage keys but not hand out more scopes
    than it holds itself."""
    narrow = post(
        client, project, "/v1/keys", {"name": "keys-only", "role": "admin", "scopes": ["admin"]}
    )
    answer = client.post(
        "/v1/keys", json={"name": "k", "scopes": ["jobs:write"]}, headers=bearer(narrow["secret"])
    )
    assert_error(answer, 403, "forbidden", ["body", "scopes"])


def test_last_used_is_written_once_a_minute_at_most(
    client: TestClient, project: ProjectKey, engine: Engine
) -> None:
    created = post(client, project, "/v1/keys", {"name": "used"})
    assert created["last_used_at"] is None
    client.get("/v1/me", headers=bearer(created["secret"]))

    def last_used() -> datetime | None:
        with session_scope(engine) as s:
            return s.get_one(ApiKey, created["id"]).last_used_at

    first = last_used()
    assert first is not None
    client.get("/v1/me", headers=bearer(created["secret"]))
    assert last_used() == first  # not rewritten within the minute
    with session_scope(engine) as s:  # a minute later
        s.execute(
            update(ApiKey)
            .where(ApiKey.id == created["id"])
            .values(last_used_at=first - timedelta(seconds=61))
        )
    client.get("/v1/me", headers=bearer(created["secret"]))
    later = last_used()
    assert later is not None and later > first - timedelta(seconds=61)


def test_another_projects_member_key_and_account_ids_are_404(
    client: TestClient, project: ProjectKey, other_project: ProjectKey
) -> None:
    member_id, _ = member_key(client, project, "viewer")
    account = post(client, project, "/v1/service-accounts", {"name": "bot", "role": "viewer"})
    key = post(client, project, "/v1/keys", {"name": "k"})
    theirs = other_project.headers
    assert_error(client.delete(f"/v1/keys/{key['id']}", headers=theirs), 404, "not_found")
    assert_error(
        client.patch(f"/v1/members/{member_id}", json={"role": "admin"}, headers=theirs),
        404,
        "not_found",
    )
    gone = client.delete(f"/v1/service-accounts/{account['id']}", headers=theirs)
    assert_error(gone, 404, "not_found")
    foreign_owner = client.post(
        "/v1/keys", json={"name": "k", "member_id": member_id}, headers=theirs
    )
    assert_error(foreign_owner, 404, "not_found")
    assert client.get("/v1/keys", headers=project.headers).json()["items"][-1]["revoked_at"] is None


def test_an_org_admin_creates_a_project_whose_first_key_administers_it(
    client: TestClient, engine: Engine, project: ProjectKey
) -> None:
    with session_scope(engine) as s:
        s.execute(
            update(ApiKey).where(ApiKey.project_id == project.project_id).values(org_admin=True)
        )
    name = f"team-{project.project_id[-6:]}"
    created = client.post("/v1/projects", json={"name": name}, headers=project.headers)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["project"]["name"] == name and body["key"]["role"] == "admin"
    admin = bearer(body["key"]["secret"])
    me = client.get("/v1/me", headers=admin).json()
    assert me["project"]["id"] == body["project"]["id"]
    assert client.get("/v1/keys", headers=admin).status_code == 200
    assert_error(client.get("/v1/projects", headers=admin), 403, "forbidden")  # not org admin
    listed = client.get("/v1/projects", headers=project.headers).json()["items"]
    assert body["project"]["id"] in [p["id"] for p in listed]
    again = client.post("/v1/projects", json={"name": name}, headers=project.headers)
    assert_error(again, 409, "conflict")


def test_a_subject_or_service_account_name_is_unique_in_a_project(
    client: TestClient, project: ProjectKey, other_project: ProjectKey
) -> None:
    body = {"subject": "same@example.com", "role": "viewer"}
    post(client, project, "/v1/members", body)
    assert_error(client.post("/v1/members", json=body, headers=project.headers), 409, "conflict")
    post(client, other_project, "/v1/members", body)  # another project may have them too
    account = {"name": "ci", "role": "member"}
    post(client, project, "/v1/service-accounts", account)
    again = client.post("/v1/service-accounts", json=account, headers=project.headers)
    assert_error(again, 409, "conflict")


def test_unstorable_names_and_ids_are_422_not_500(client: TestClient, project: ProjectKey) -> None:
    headers = {**project.headers, "Content-Type": "application/json"}
    for subject in (b"\\ud800", b"a\\u0000b"):  # a lone surrogate, NUL: JSON escapes
        body = b'{"subject": "' + subject + b'", "role": "viewer"}'
        answer = client.post("/v1/members", content=body, headers=headers)
        assert_error(answer, 422, "validation_error", ["body", "subject"])
    owner = client.post(
        "/v1/keys", json={"name": "k", "member_id": "mem_\x00"}, headers=project.headers
    )
    assert_error(owner, 422, "validation_error", ["body", "member_id"])
    path = client.patch("/v1/members/%ff%00", json={"role": "admin"}, headers=project.headers)
    assert_error(path, 422, "validation_error", ["path", "member_id"])
