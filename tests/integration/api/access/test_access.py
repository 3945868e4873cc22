"""Every route, generated from the app's own OpenAPI (so new routes are covered unasked):

- with a key of ANOTHER project on a real resource of the first, every route with a path
  parameter answers 404 (never 403, never the resource);
- with each role (viewer, member, admin), each single-scope key and an organisation admin key,
  every route answers exactly what its `x-permission` documents: 403 `forbidden` when not
  allowed, and neither 401 nor 403 (nor a 5xx) when allowed.

A path parameter the tables below cannot fill, or a route with a required body and path
parameters that `BODIES` does not cover, fails the test: nothing is skipped silently.
"""

from __future__ import annotations

import io
import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from api.main import create_app
from core.access import auth
from core.jobs import upserts
from core.openai.projection import BASE_LABEL, JOB_PREFIX, model_name
from core.platform.db import session_scope
from core.platform.settings import Settings
from core.platform.tables import Checkpoint, Job, JobState, utcnow
from tests.conftest import ProjectKey, make_project
from tests.integration.api.code_archives import code_files, tar_gz, upload
from tests.integration.api.conftest import job_spec, submit
from tests.support.sessions import run_and_sampler

_METHODS = ("get", "post", "put", "patch", "delete")
# Routes anyone may call, without a key. Any other route must document its permission.
PUBLIC = {
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/v1/spec/schema"),
    ("get", "/tinker/api/v1/healthz"),
}
# Valid bodies for the routes with path parameters and a required body (so a 404 is about the
# resource, not a 422 about the body).
BODIES: dict[str, Any] = {
    "datasets_preview": {},
    "access_update_member": {"role": "viewer"},
    "quotas_set": {"max_slots": 2},
    "webhooks_update": {"description": "renamed"},
    "jobs_update": {"note": "checked"},
    "tinker_sessions_finish": {"reason": {"type": "success"}},
    "tinker_checkpoint_ttl": {"ttl_seconds": 86400},
}
# Path parameters that name something every project shares (a pool), not a resource of one
# project: such routes act on the caller's own project and are not part of the 404 test.
SHARED_PARAMS = {"pool"}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    operation_id: str
    permission: str | None
    path_params: tuple[str, ...]
    body_required: bool
    statuses: frozenset[str]  # the response codes it documents

    def __str__(self) -> str:
        return self.operation_id


def _operations() -> list[Operation]:
    """Every documented operation of the app (its route table, as its OpenAPI states it)."""
    schema = create_app(Settings(database_url="sqlite://")).openapi()
    found = []
    for path, item in schema["paths"].items():
        for method, op in item.items():
            if method not in _METHODS:
                continue
            params = tuple(p["name"] for p in op.get("parameters", []) if p["in"] == "path")
            body = op.get("requestBody", {}).get("required", False)
            statuses = frozenset(op["responses"])
            found.append(
                Operation(
                    method, path, op["operationId"], op.get("x-permission"), params, body, statuses
                )
            )
    return found


OPERATIONS = _operations()
WITH_PATH_PARAMS = [
    op for op in OPERATIONS if op.path_params and not SHARED_PARAMS & set(op.path_params)
]


@dataclass
class World:
    """A project with one of each resource, keys of each kind, and another project."""

    owner: ProjectKey
    other: ProjectKey
    job_id: int = 0
    checkpoint_id: int = 0
    dataset_id: str = ""
    code_id: str = ""
    file_id: str = ""
    model_id: str = ""
    member_id: str = ""  # a member no principal below belongs to (so deleting it is harmless)
    account_id: str = ""
    key_id: str = ""
    pool: str = ""
    webhook_id: str = ""
    secret_id: str = ""
    delivery_id: str = ""
    sweep_id: int = 0
    session_id: str = ""  # a training session (`/tinker`)
    sampler_id: str = ""  # a sampling session of it, on a training client's sampler weights
    run_id: str = ""  # a training client of it (its job never placed)
    principals: dict[str, tuple[auth.Principal, str]] = field(default_factory=dict)


# How each kind of path parameter is filled with the world's real resource: (area, name).
PATH_PARAMS: dict[tuple[str, str], Callable[[World], str]] = {
    ("v1", "job_id"): lambda w: str(w.job_id),
    ("v1", "checkpoint_id"): lambda w: str(w.checkpoint_id),
    ("v1", "dataset_id"): lambda w: w.dataset_id,
    ("v1", "code_id"): lambda w: w.code_id,
    ("v1", "member_id"): lambda w: w.member_id,
    ("v1", "account_id"): lambda w: w.account_id,
    ("v1", "key_id"): lambda w: w.key_id,
    ("v1", "pool"): lambda w: w.pool,
    ("v1", "webhook_id"): lambda w: w.webhook_id,
    ("v1", "secret_id"): lambda w: w.secret_id,
    ("v1", "delivery_id"): lambda w: w.delivery_id,
    ("v1", "sweep_id"): lambda w: str(w.sweep_id),
    ("v1", "kind"): lambda w: "adapter",  # a LoRA export (the job has none: 409 for its own)
    ("v1", "name"): lambda w: "adapter_config.json",
    ("openai", "job_id"): lambda w: f"{JOB_PREFIX}{w.job_id}",
    ("openai", "file_id"): lambda w: w.file_id,
    ("openai", "model_id"): lambda w: w.model_id,
    ("v1", "session_id"): lambda w: w.session_id,
    ("tinker", "session_id"): lambda w: w.session_id,
    ("tinker", "sampler_id"): lambda w: w.sampler_id,
    ("tinker", "training_run_id"): lambda w: w.run_id,
    ("tinker", "name"): lambda w: "saved",  # a state's name: none saved, 404 for its own too
}


def url(world: World, op: Operation) -> str:
    area = op.path.split("/")[1] if op.path.startswith(("/openai/", "/tinker/")) else "v1"
    path = op.path
    for name in op.path_params:
        fill = PATH_PARAMS.get((area, name))
        if fill is None:
            pytest.fail(f"{op}: no way to fill path parameter {name!r}; add it to PATH_PARAMS")
        path = path.replace(f"{{{name}}}", fill(world))
    return path


def call(client: TestClient, world: World, op: Operation, secret: str) -> httpx.Response:
    kwargs: dict[str, Any] = {"headers": {"Authorization": f"Bearer {secret}"}}
    if op.body_required or op.method in ("post", "patch", "put"):
        if op.path_params and op.body_required and op.operation_id not in BODIES:
            pytest.fail(f"{op}: needs a body; add a valid one to BODIES")
        kwargs["json"] = BODIES.get(op.operation_id, {})
    return client.request(op.method, url(world, op), **kwargs)


def _post(client: TestClient, key: ProjectKey, path: str, body: dict[str, Any]) -> Any:
    answer = client.post(path, json=body, headers=key.headers)
    assert answer.status_code == 201, answer.text
    return answer.json()


def _fine_tune_file(client: TestClient, key: ProjectKey) -> str:
    record = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    }
    data = ("\n".join(json.dumps(record) for _ in range(4)) + "\n").encode()
    answer = client.post(
        "/openai/v1/files",
        files={"file": ("train.jsonl", io.BytesIO(data), "application/jsonl")},
        data={"purpose": "fine-tune"},
        headers=key.headers,
    )
    assert answer.status_code in (200, 201), answer.text
    return str(answer.json()["id"])


def _principal_keys(client: TestClient, engine: Engine, world: World) -> None:
    """A member key per role, an owner-less admin key per single scope, an org admin key."""
    owner = world.owner
    for role in auth.Role:
        member = _post(client, owner, "/v1/members", {"subject": f"{role}@x.org", "role": role})
        key = _post(client, owner, "/v1/keys", {"name": role, "member_id": member["id"]})
        principal = auth.Principal(owner.project_id, owner.project_name, "", "", "", role=role)
        world.principals[f"role={role.value}"] = (principal, key["secret"])
    for scope in auth.ALL_SCOPES_ORDERED:
        key = _post(client, owner, "/v1/keys", {"name": scope, "role": "admin", "scopes": [scope]})
        principal = auth.Principal(
            owner.project_id, owner.project_name, "", "", "", scopes=frozenset({scope})
        )
        world.principals[f"scope={scope}"] = (principal, key["secret"])
    with session_scope(engine) as s:
        secret = auth.create_api_key(session=s, project_id=owner.project_id, org_admin=True)
    principal = auth.Principal(owner.project_id, owner.project_name, "", "", "", org_admin=True)
    world.principals["org_admin"] = (principal, secret)


def build_world(client: TestClient, engine: Engine, corpus_dir: Path, tmp: Path) -> World:
    world = World(owner=make_project(engine), other=make_project(engine))
    owner = world.owner
    world.dataset_id = _post(
        client, owner, "/v1/datasets", {"name": "corpus", "uri": str(corpus_dir)}
    )["id"]
    pool = f"test-{secrets.token_hex(4)}"
    job = submit(client, owner, job_spec(world.dataset_id, resources={"pool": pool}))
    world.job_id = int(job["id"])
    step_dir = tmp / f"job{world.job_id}" / "step_00000010"
    step_dir.mkdir(parents=True)
    (step_dir / ".metadata").write_bytes(b"a checkpoint")
    with session_scope(engine) as s:
        upserts.checkpoint(
            session=s, job_id=world.job_id, attempt=1, step=10, uri=str(step_dir), size_bytes=12
        )
        # A finished fine-tuning job: terminal (its stream ends), with a model and a checkpoint.
        s.execute(
            update(Job)
            .where(Job.id == world.job_id)
            .values(state=JobState.SUCCEEDED, finished_at=utcnow(), labels={BASE_LABEL: "tiny"})
        )
    with session_scope(engine) as s:
        job_row = s.get_one(Job, world.job_id)
        world.model_id = model_name(job_row)
        world.checkpoint_id = _checkpoint_id(s, world.job_id)
    export = f"/v1/jobs/{world.job_id}/checkpoints/{world.checkpoint_id}/export"
    assert client.post(export, headers=owner.headers).status_code in (200, 201, 202)
    world.code_id = upload(client, owner, tar_gz(code_files())).json()["id"]
    world.file_id = _fine_tune_file(client, owner)
    world.member_id = _post(
        client, owner, "/v1/members", {"subject": "victim@x.org", "role": "viewer"}
    )["id"]
    world.account_id = _post(
        client, owner, "/v1/service-accounts", {"name": "victim", "role": "viewer"}
    )["id"]
    world.key_id = _post(client, owner, "/v1/keys", {"name": "victim"})["id"]
    world.pool = pool
    # A public address literal: no DNS lookup, and nothing is sent (no delivery loop in tests).
    hook = _post(
        client, owner, "/v1/webhooks", {"url": "https://93.184.216.34/hook", "event_types": ["*"]}
    )
    world.webhook_id, world.secret_id = hook["id"], hook["secret"]["id"]
    ping = client.post(f"/v1/webhooks/{world.webhook_id}/ping", headers=owner.headers)
    assert ping.status_code == 202, ping.text
    world.delivery_id = str(ping.json()["id"])
    sweep = {
        "name": "access",
        "base": job_spec(world.dataset_id, resources={"pool": pool}),
        "space": {"optim.lr": {"choice": [1e-3, 1e-2]}},
    }
    world.sweep_id = int(_post(client, owner, "/v1/sweeps", sweep)["id"])
    created = client.post(
        "/tinker/api/v1/create_session",
        json={"tags": [], "user_metadata": None, "sdk_version": "0.38.0"},
        headers=owner.headers,
    )
    assert created.status_code == 200, created.text
    world.session_id = created.json()["session_id"]
    world.run_id, world.sampler_id = run_and_sampler(  # a training client, on the job above
        engine, owner.project_id, world.session_id, world.job_id
    )
    _principal_keys(client, engine, world)
    return world


def _checkpoint_id(session: Session, job_id: int) -> int:
    return session.scalars(select(Checkpoint.id).where(Checkpoint.job_id == job_id)).one()


@pytest.fixture(scope="module")
def shared_world(
    client: TestClient,
    engine: Engine,
    corpus_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    yield build_world(client, engine, corpus_dir, tmp_path_factory.mktemp("access"))


def test_the_generator_sees_every_route_and_each_states_its_permission() -> None:
    assert len(OPERATIONS) >= 50 and len(WITH_PATH_PARAMS) >= 25
    undocumented = [
        str(op) for op in OPERATIONS if op.permission is None and (op.method, op.path) not in PUBLIC
    ]
    assert undocumented == []
    known = {"authenticated", "org_admin", *auth.ALL_SCOPES}
    assert {op.permission for op in OPERATIONS if op.permission} <= known
    restricted = [op for op in OPERATIONS if op.permission not in (None, "authenticated")]
    assert [str(op) for op in restricted if "403" not in op.statuses] == []


@pytest.mark.parametrize("op", WITH_PATH_PARAMS, ids=str)
def test_another_projects_key_gets_404_on_every_route_with_a_path_parameter(
    client: TestClient, shared_world: World, op: Operation
) -> None:
    answer = call(client, shared_world, op, shared_world.other.api_key)
    assert answer.status_code == 404, (op.path, answer.text)
    assert answer.json()["error"]["code"] == "not_found"
    # The resource is real: its own project's admin key does not get 404 for the reads.
    if op.method == "get" and "stream" not in op.path:
        mine = call(client, shared_world, op, shared_world.owner.api_key)
        assert mine.status_code in (200, 409), (op.path, mine.text)


def _allowed(principal: auth.Principal, permission: str) -> bool:
    if permission == "authenticated":
        return True
    if permission == "org_admin":
        return principal.org_admin
    return auth.allows(principal, auth.Permission(permission))


@pytest.mark.parametrize(
    "op", [op for op in OPERATIONS if (op.method, op.path) not in PUBLIC], ids=str
)
def test_every_route_answers_each_role_and_scope_as_documented(
    client: TestClient,
    engine: Engine,
    corpus_dir: Path,
    tmp_path: Path,
    shared_world: World,
    op: Operation,
) -> None:
    # Reads change nothing and share one world; every other operation gets a fresh one.
    world = (
        shared_world if op.method == "get" else build_world(client, engine, corpus_dir, tmp_path)
    )
    assert op.permission is not None
    principals = sorted(world.principals.items(), key=lambda kv: _allowed(kv[1][0], op.permission))
    for name, (principal, secret) in principals:  # refused ones first: they change nothing
        answer = call(client, world, op, secret)
        if _allowed(principal, op.permission):
            assert answer.status_code not in (401, 403), (name, answer.text)
            assert answer.status_code < 500, (name, answer.text)
        else:
            assert answer.status_code == 403, (name, answer.text)
            assert answer.json()["error"]["code"] == "forbidden", (name, answer.text)


@pytest.mark.parametrize(
    "op", [op for op in OPERATIONS if (op.method, op.path) not in PUBLIC], ids=str
)
def test_every_non_public_route_is_401_without_a_valid_key(
    client: TestClient, shared_world: World, op: Operation
) -> None:
    answer = call(client, shared_world, op, "ty_not-a-key")
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "unauthorized"
