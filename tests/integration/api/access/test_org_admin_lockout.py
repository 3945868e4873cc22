"""The organisation keeps an administrator: revoking, demoting, removing or disabling its last
active organisation admin credential is 409, whoever asks (that key itself included), and two
such changes at once cannot both pass.

The organisation is a database: this module has one of its own (the session's holds other
tests' organisation admin keys), and each test starts with none of its admin keys active.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, text, update

from api.main import create_app
from core.access import auth, identity
from core.platform.db import make_engine, session_factory, session_scope
from core.platform.errors import Conflict
from core.platform.settings import Settings
from core.platform.tables import ApiKey, utcnow
from tests.conftest import ProjectKey, fresh_database, make_project
from tests.integration.api.conftest import assert_error

MESSAGE = (
    "the last active organisation admin credential cannot be removed; create another admin first"
)


@pytest.fixture(scope="module")
def org_settings(settings: Settings) -> Iterator[Settings]:
    with fresh_database() as url:
        yield settings.model_copy(update={"database_url": url})


@pytest.fixture(scope="module")
def org_engine(org_settings: Settings) -> Iterator[Engine]:
    engine = make_engine(org_settings.database_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def org_client(org_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(org_settings), raise_server_exceptions=True) as client:
        yield client


@pytest.fixture
def admin(org_engine: Engine) -> ProjectKey:
    """A fresh project's admin key (not an organisation admin), in an organisation whose
    earlier organisation admin keys are all revoked."""
    with session_scope(org_engine) as s:
        s.execute(update(ApiKey).where(ApiKey.org_admin.is_(True)).values(revoked_at=utcnow()))
    return make_project(org_engine)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def bootstrap(engine: Engine, project_id: str) -> tuple[str, str]:
    """(id, secret) of a new organisation admin key, as `torchyard admin bootstrap` makes it."""
    with session_scope(engine) as s:
        secret = auth.create_api_key(session=s, project_id=project_id, org_admin=True)
        key_id = s.scalar(select(ApiKey.id).where(ApiKey.key_hash == auth.hash_key(secret)))
    assert key_id is not None
    return key_id, secret


def make_org_admin(engine: Engine, key_id: str) -> None:
    """Make an owned key an organisation admin key (no API does: stored rows may be so)."""
    with session_scope(engine) as s:
        s.execute(update(ApiKey).where(ApiKey.id == key_id).values(org_admin=True))


def created(answer: httpx.Response) -> dict[str, str]:
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def assert_last_admin_refused(answer: httpx.Response) -> None:
    assert_error(answer, 409, "conflict")
    assert answer.json()["error"]["message"] == MESSAGE


def active(engine: Engine) -> int:
    with session_scope(engine) as s:
        return identity.active_org_admins(s)


def test_the_last_org_admin_key_cannot_revoke_itself_until_another_exists(
    org_client: TestClient, org_engine: Engine, admin: ProjectKey
) -> None:
    key_id, secret = bootstrap(org_engine, admin.project_id)
    assert_last_admin_refused(org_client.delete(f"/v1/keys/{key_id}", headers=bearer(secret)))
    assert_last_admin_refused(org_client.delete(f"/v1/keys/{key_id}", headers=admin.headers))
    assert org_client.get("/v1/projects", headers=bearer(secret)).status_code == 200

    elsewhere = make_project(org_engine)  # the count is the organisation's, not the project's
    _, other = bootstrap(org_engine, elsewhere.project_id)
    revoked = org_client.delete(f"/v1/keys/{key_id}", headers=bearer(secret))
    assert revoked.status_code == 200, revoked.text
    assert org_client.get("/v1/projects", headers=bearer(secret)).status_code == 401
    assert org_client.get("/v1/projects", headers=bearer(other)).status_code == 200
    assert active(org_engine) == 1


def test_an_expired_org_admin_key_does_not_count(
    org_client: TestClient, org_engine: Engine, admin: ProjectKey
) -> None:
    key_id, secret = bootstrap(org_engine, admin.project_id)
    stale_id, _ = bootstrap(org_engine, admin.project_id)
    with session_scope(org_engine) as s:
        past = utcnow() - timedelta(minutes=1)
        s.execute(update(ApiKey).where(ApiKey.id == stale_id).values(expires_at=past))
    assert_last_admin_refused(org_client.delete(f"/v1/keys/{key_id}", headers=bearer(secret)))


def test_the_owner_of_the_last_org_admin_key_cannot_be_demoted_or_removed(
    org_client: TestClient, org_engine: Engine, admin: ProjectKey
) -> None:
    member = created(
        org_client.post(
            "/v1/members",
            json={"subject": "root@example.com", "role": "admin"},
            headers=admin.headers,
        )
    )
    key = created(
        org_client.post(
            "/v1/keys", json={"name": "root", "member_id": member["id"]}, headers=admin.headers
        )
    )
    make_org_admin(org_engine, key["id"])
    path = f"/v1/members/{member['id']}"
    for role in ("member", "viewer"):
        demoted = org_client.patch(path, json={"role": role}, headers=admin.headers)
        assert_last_admin_refused(demoted)
    assert_last_admin_refused(org_client.delete(path, headers=bearer(key["secret"])))
    me = org_client.get("/v1/me", headers=bearer(key["secret"])).json()
    assert me["role"] == "admin" and me["org_admin"], me

    bootstrap(org_engine, admin.project_id)
    assert org_client.patch(path, json={"role": "viewer"}, headers=admin.headers).is_success
    assert org_client.delete(path, headers=admin.headers).is_success


def test_the_service_account_of_the_last_org_admin_key_cannot_be_disabled(
    org_client: TestClient, org_engine: Engine, admin: ProjectKey
) -> None:
    account = created(
        org_client.post(
            "/v1/service-accounts",
            json={"name": "platform", "role": "admin"},
            headers=admin.headers,
        )
    )
    key = created(
        org_client.post(
            "/v1/keys",
            json={"name": "platform", "service_account_id": account["id"]},
            headers=admin.headers,
        )
    )
    make_org_admin(org_engine, key["id"])
    path = f"/v1/service-accounts/{account['id']}"
    assert_last_admin_refused(org_client.delete(path, headers=admin.headers))
    assert org_client.get("/v1/projects", headers=bearer(key["secret"])).status_code == 200

    bootstrap(org_engine, admin.project_id)
    assert org_client.delete(path, headers=admin.headers).is_success
    assert org_client.get("/v1/projects", headers=bearer(key["secret"])).status_code == 401


def test_changes_that_keep_an_org_admin_pass(
    org_client: TestClient, org_engine: Engine, admin: ProjectKey
) -> None:
    """Only the last organisation admin credential is guarded: not project admins, not an
    organisation with none to lose."""
    assert active(org_engine) == 0
    plain = created(org_client.post("/v1/keys", json={"name": "plain"}, headers=admin.headers))
    assert org_client.delete(f"/v1/keys/{plain['id']}", headers=admin.headers).is_success
    bootstrap(org_engine, admin.project_id)
    member = created(
        org_client.post(
            "/v1/members", json={"subject": "a@example.com", "role": "admin"}, headers=admin.headers
        )
    )
    demoted = org_client.patch(
        f"/v1/members/{member['id']}", json={"role": "viewer"}, headers=admin.headers
    )
    assert demoted.is_success, demoted.text


def test_two_concurrent_revocations_of_the_last_two_org_admin_keys_cannot_both_pass(
    org_client: TestClient, org_engine: Engine, admin: ProjectKey
) -> None:
    first_id, first = bootstrap(org_engine, admin.project_id)
    second_id, second = bootstrap(org_engine, admin.project_id)
    start = threading.Barrier(2)

    def revoke(key_id: str, secret: str) -> int:
        start.wait()
        return org_client.delete(f"/v1/keys/{key_id}", headers=bearer(secret)).status_code

    with ThreadPoolExecutor(2) as pool:
        # Each key revokes the other.
        answers = [pool.submit(revoke, first_id, second), pool.submit(revoke, second_id, first)]
        statuses = sorted(a.result() for a in answers)
    # Exactly one passes. The other is refused: 409 when both got past authentication (the
    # lock makes the second count what the first left), 401 when the first had already
    # committed before the second's key was looked up (the caller's own key is revoked).
    assert statuses in ([200, 401], [200, 409]), statuses
    assert active(org_engine) == 1


def test_a_second_revocation_waits_for_the_first_and_counts_what_it_left(
    org_engine: Engine, admin: ProjectKey
) -> None:
    """Deterministic interleaving: the first revocation holds its transaction open; the
    second blocks on the organisation admin keys' row locks until it commits, then is refused.
    Without the lock, each would count the other's key as still active and both would pass."""
    first_id, _ = bootstrap(org_engine, admin.project_id)
    second_id, _ = bootstrap(org_engine, admin.project_id)
    make = session_factory(org_engine)
    with make() as one, make() as two:
        identity.revoke_key(session=one, project_id=admin.project_id, key_id=first_id)
        pid = two.scalar(text("SELECT pg_backend_pid()"))
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(
                identity.revoke_key, session=two, project_id=admin.project_id, key_id=second_id
            )
            _wait_until_blocked(org_engine, pid)
            assert not waiting.done()
            one.commit()
            with pytest.raises(Conflict, match="last active organisation admin credential"):
                waiting.result(timeout=30)
        two.rollback()
    assert active(org_engine) == 1


def _wait_until_blocked(engine: Engine, pid: int | None, timeout_s: float = 10.0) -> None:
    """Until backend `pid` waits on a lock (pg_stat_activity)."""
    query = text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid")
    deadline = utcnow() + timedelta(seconds=timeout_s)
    with engine.connect() as conn:
        while utcnow() < deadline:
            if conn.execute(query, {"pid": pid}).scalar() == "Lock":
                return
            conn.rollback()
            threading.Event().wait(0.05)
    pytest.fail(f"backend {pid} never waited on a lock")
