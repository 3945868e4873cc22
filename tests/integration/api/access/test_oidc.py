"""SSO: OIDC access tokens from the configured issuer, verified against its JWKS, whose groups
map to project roles. The issuer is real: key pairs made here, its discovery document and JWKS
served over HTTP on loopback (tests/integration/api/oidc_provider.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from core.access import oidc
from core.access.auth import Role
from core.platform.db import session_scope
from core.platform.errors import Forbidden
from core.platform.settings import OidcGrant, Settings
from tests.conftest import ProjectKey, make_project
from tests.integration.api.conftest import assert_error
from tests.integration.api.oidc_provider import AUDIENCE, Provider, ec_key, rsa_key, serve


@dataclass(frozen=True)
class Sso:
    client: TestClient
    provider: Provider
    a: ProjectKey  # groups a-viewers, a-members, a-admins
    b: ProjectKey  # group b-viewers

    def headers(self, token: str, project: str | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {token}"}
        if project is not None:
            headers[oidc.PROJECT_HEADER] = project
        return headers


def _sso_settings(settings: Settings, issuer: str, a: str, b: str, **extra: object) -> Settings:
    roles = {
        "a-viewers": OidcGrant(project=a, role="viewer"),
        "a-members": OidcGrant(project=a, role="member"),
        "a-admins": OidcGrant(project=a, role="admin"),
        "b-viewers": OidcGrant(project=b, role="viewer"),
        "ghost-admins": OidcGrant(project="no-such-project", role="admin"),
    }
    update = {
        "oidc_issuer": issuer,
        "oidc_audience": AUDIENCE,
        "oidc_group_roles": roles,
        "oidc_algorithms": ["RS256", "ES256"],
        "oidc_jwks_cooldown_s": 0.0,  # a rotated key is fetched at once
        "oidc_leeway_s": 0.0,
        **extra,
    }
    return settings.model_copy(update=update)


@pytest.fixture(scope="module")
def sso(settings: Settings, engine: Engine) -> Iterator[Sso]:
    a, b = make_project(engine), make_project(engine)
    provider = Provider(keys=[rsa_key(), ec_key()])
    with serve(provider):
        app = create_app(_sso_settings(settings, provider.issuer, a.project_name, b.project_name))
        with TestClient(app) as client:
            yield Sso(client=client, provider=provider, a=a, b=b)


def _me(sso: Sso, token: str, project: str | None = None) -> dict[str, object]:
    answer = sso.client.get("/v1/me", headers=sso.headers(token, project))
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _refused(sso: Sso, token: str, status: int = 401, project: str | None = None) -> str:
    answer = sso.client.get("/v1/jobs", headers=sso.headers(token, project))
    code = {401: "unauthorized", 403: "forbidden", 503: "unavailable"}[status]
    return str(assert_error(answer, status, code)["message"])


def test_a_valid_token_acts_in_its_groups_project_as_its_subject(sso: Sso) -> None:
    token = sso.provider.token(groups=["a-viewers", "unrelated"], sub="alice")
    me = _me(sso, token)
    assert me["project"] == {"id": sso.a.project_id, "name": sso.a.project_name}
    assert me["key"] == {"id": "oidc:alice", "name": "alice", "prefix": "oidc"}
    assert sso.client.get("/v1/jobs", headers=sso.headers(token)).status_code == 200


def test_an_es256_token_is_accepted_too(sso: Sso) -> None:
    token = sso.provider.token(groups=["b-viewers"], key=sso.provider.keys[1])
    assert _me(sso, token)["project"] == {"id": sso.b.project_id, "name": sso.b.project_name}


def test_api_keys_still_work_with_sso_on(sso: Sso) -> None:
    answer = sso.client.get("/v1/me", headers=sso.a.headers)
    assert answer.status_code == 200
    assert answer.json()["key"]["prefix"] == sso.a.api_key[:10]


@pytest.mark.parametrize(
    ("groups", "role"),
    [
        (["a-viewers"], Role.VIEWER),
        (["a-members"], Role.MEMBER),
        (["a-admins"], Role.ADMIN),
        (["a-viewers", "a-admins", "a-members"], Role.ADMIN),  # the highest role wins
        ("a-members", Role.MEMBER),  # a single group as a string
    ],
)
def test_groups_map_to_the_highest_role_with_its_scopes(
    sso: Sso, engine: Engine, groups: list[str] | str, role: Role
) -> None:
    settings = sso.client.app.state.settings  # type: ignore[attr-defined]
    claims = {"sub": "carol", "groups": groups}
    with session_scope(engine) as s:
        principal = oidc.grant(session=s, settings=settings, claims=claims, project=None)
    assert principal.project_id == sso.a.project_id
    assert principal.role == role
    writes = {"jobs:write", "datasets:write"}
    expected = {
        Role.VIEWER: {"jobs:read"},
        Role.MEMBER: {"jobs:read", *writes},
        Role.ADMIN: {"jobs:read", *writes, "admin"},
    }
    assert principal.scopes == expected[role]


def test_an_expired_token_is_401(sso: Sso) -> None:
    token = sso.provider.token(groups=["a-viewers"], lifetime_s=-60)
    assert "expired" in _refused(sso, token)


def test_a_token_not_yet_valid_is_401(sso: Sso) -> None:
    token = sso.provider.token(groups=["a-viewers"], nbf=int(time.time()) + 3600)
    assert "not yet valid" in _refused(sso, token)


def test_a_token_for_another_audience_is_401(sso: Sso) -> None:
    token = sso.provider.token(groups=["a-viewers"], aud="some-other-api")
    assert "audience" in _refused(sso, token).lower()


def test_a_token_of_another_issuer_is_401(sso: Sso) -> None:
    token = sso.provider.token(groups=["a-viewers"], iss="https://evil.example.com")
    assert "issuer" in _refused(sso, token).lower()


def test_a_token_without_expiry_is_401(sso: Sso) -> None:
    token = sso.provider.token(groups=["a-viewers"], exp=None)
    assert "exp" in _refused(sso, token)


def test_a_tampered_token_is_401(sso: Sso) -> None:
    header, body, signature = sso.provider.token(groups=["a-viewers"]).split(".")
    admin = sso.provider.token(groups=["a-admins"], sub="mallory").split(".")[1]
    assert "signature" in _refused(sso, f"{header}.{admin}.{signature}").lower()
    flipped = signature[:-4] + ("AAAA" if not signature.endswith("AAAA") else "BBBB")
    assert "signature" in _refused(sso, f"{header}.{body}.{flipped}").lower()


def test_a_token_signed_by_an_unknown_key_is_401(sso: Sso) -> None:
    stranger = rsa_key()
    token = sso.provider.token(groups=["a-admins"], key=stranger)
    assert stranger.kid in _refused(sso, token)


def test_unsigned_and_hmac_tokens_are_refused(sso: Sso) -> None:
    public_pem = sso.provider.keys[0].public_pem()
    for algorithm in ("none", "HS256"):
        token = sso.provider.forged(algorithm=algorithm, secret=public_pem, groups=["a-admins"])
        assert algorithm in _refused(sso, token)


def test_a_token_whose_groups_map_to_no_project_is_401(sso: Sso) -> None:
    assert "no group" in _refused(sso, sso.provider.token(groups=["marketing"]))
    assert "no group" in _refused(sso, sso.provider.token())  # no groups claim at all


def test_a_group_mapped_to_a_missing_project_is_403(sso: Sso) -> None:
    assert "does not exist" in _refused(sso, sso.provider.token(groups=["ghost-admins"]), 403)


def test_the_project_header_picks_among_several_projects(sso: Sso) -> None:
    token = sso.provider.token(groups=["a-members", "b-viewers"])
    assert oidc.PROJECT_HEADER in _refused(sso, token)  # two projects, no header: 401
    assert _me(sso, token, sso.b.project_name)["project"]["id"] == sso.b.project_id  # type: ignore[index]
    assert _me(sso, token, sso.a.project_name)["project"]["id"] == sso.a.project_id  # type: ignore[index]
    assert "not-granted" in _refused(sso, token, 403, project="not-granted")


def test_a_header_naming_an_ungranted_project_is_403_even_with_one_project(sso: Sso) -> None:
    token = sso.provider.token(groups=["a-viewers"])
    assert sso.b.project_name in _refused(sso, token, 403, project=sso.b.project_name)


def test_a_rotated_in_key_is_accepted_once_the_jwks_publishes_it(sso: Sso) -> None:
    new = rsa_key()
    token = sso.provider.token(groups=["a-viewers"], key=new)
    assert new.kid in _refused(sso, token)  # not published yet
    sso.provider.keys.append(new)
    try:
        fetches = sso.provider.jwks_fetches
        assert _me(sso, token)["key"] == {"id": "oidc:alice", "name": "alice", "prefix": "oidc"}
        assert sso.provider.jwks_fetches == fetches + 1
        _me(sso, token)  # now cached: no refetch
        assert sso.provider.jwks_fetches == fetches + 1
    finally:
        sso.provider.keys.remove(new)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("down", ["jwks", "discovery"])
def test_an_unreachable_issuer_is_503_not_500(
    settings: Settings, engine: Engine, down: str
) -> None:
    project = make_project(engine)
    provider = Provider(keys=[rsa_key()])
    with serve(provider):
        token = provider.token(groups=["a-viewers"])
        issuer, extra = provider.issuer, {}
    dead = f"http://127.0.0.1:{_closed_port()}"
    if down == "jwks":
        extra = {"oidc_jwks_url": f"{dead}/jwks.json"}
    else:
        issuer = dead
        token = provider.token(groups=["a-viewers"], iss=dead)
    app = create_app(_sso_settings(settings, issuer, project.project_name, "b", **extra))
    with TestClient(app) as client:
        answer = client.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    error = assert_error(answer, 503, "unavailable")
    assert "SSO" in error["message"]


def test_a_project_outside_the_grants_is_forbidden_in_the_service(sso: Sso, engine: Engine) -> None:
    settings = sso.client.app.state.settings  # type: ignore[attr-defined]
    with session_scope(engine) as s, pytest.raises(Forbidden, match="grants no role"):
        oidc.grant(
            session=s,
            settings=settings,
            claims={"sub": "x", "groups": ["a-viewers"]},
            project=sso.b.project_name,
        )


@pytest.mark.parametrize("algorithms", [["none"], ["HS256"], ["RS256", "HS512"], []])
def test_settings_refuse_symmetric_or_no_algorithms(algorithms: list[str]) -> None:
    with pytest.raises(ValueError, match="TORCHYARD_OIDC_ALGORITHMS"):
        Settings(oidc_algorithms=algorithms)


def test_settings_refuse_an_issuer_without_audience() -> None:
    with pytest.raises(ValueError, match="TORCHYARD_OIDC_AUDIENCE"):
        Settings(oidc_issuer="https://login.example.com")


@pytest.mark.parametrize(
    ("group", "status"), [("a-viewers", 403), ("a-members", 403), ("a-admins", 200)]
)
def test_each_role_gets_the_documented_outcome_on_an_admin_route(
    sso: Sso, group: str, status: int
) -> None:
    token = sso.provider.token(groups=[group], sub=f"user-{group}")
    assert sso.client.get("/v1/jobs", headers=sso.headers(token)).status_code == 200  # reads
    answer = sso.client.get("/v1/audit", headers=sso.headers(token))
    if status == 403:
        assert "'admin' is needed" in assert_error(answer, 403, "forbidden")["message"]
    else:
        assert answer.status_code == 200, answer.text
