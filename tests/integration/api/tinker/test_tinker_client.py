"""Issue 47, first slice: the official `tinker` client (0.38.0), unchanged and configured only by
`TINKER_BASE_URL` and `TINKER_API_KEY`, connects to a real API (uvicorn) under `/tinker`, reads
its capabilities, creates a session that heartbeats, reads it back over REST, and closes it;
another project's key gets 404 on it and a wrong key 401. Answers are parsed by the client's
own pydantic types (its `_strict_response_validation` is on)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinker
from sqlalchemy import Engine, update

from core.platform.db import session_scope
from core.platform.settings import Settings
from core.platform.tables import SessionState, TrainingSession, utcnow
from tests.conftest import ProjectKey, make_project, settings_env
from tests.integration.conftest import serve_api

BASE = "tiny-llama"
HEARTBEAT_WAIT_S = 25.0  # the client beats every 10 s


@pytest.fixture(scope="module")
def server(
    settings: Settings, models_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """An API whose registry offers `BASE` (seq_len 384); its `/tinker` base URL."""
    registry = {BASE: {"path": str(models_root / "tinker-llama"), "seq_len": 384}}
    env = {**settings_env(settings), "TORCHYARD_BASE_MODELS": json.dumps(registry)}
    with serve_api(env, tmp_path_factory.mktemp("tinker_api")) as base_url:
        yield f"{base_url}/tinker"


def _rest(server: str, path: str, key: str, **kwargs: Any) -> httpx.Response:
    method = "POST" if "json" in kwargs else "GET"
    return httpx.request(
        method, f"{server}/api/v1{path}", headers={"X-API-Key": f"tml-{key}"}, **kwargs
    )


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.usefixtures("client_env")
def test_the_official_client_connects_creates_a_session_that_heartbeats_and_closes_it(
    server: str, owner: ProjectKey, engine: Engine
) -> None:
    rest = tinker.RestClient()
    capabilities = rest.get_server_capabilities().result()
    assert [(m.model_name, m.max_context_length) for m in capabilities.supported_models] == [
        (BASE, 384)
    ]

    service = tinker.ServiceClient(user_metadata={"experiment": "sums-rl"}, display_name="sums")
    session_id = service.holder.get_session_id()  # the holder creates the session on first use
    assert rest.list_sessions().result().sessions[0] == session_id
    seen = rest.get_session(session_id).result()  # the client's own GetSessionResponse
    assert seen.user_metadata == {"experiment": "sums-rl"}
    assert seen.display_name == "sums"
    assert (seen.training_run_ids, seen.sampler_ids) == ([], [])

    first = _rest(server, f"/sessions/{session_id}", owner.api_key).json()
    assert first["state"] == "active"
    assert first["sdk_version"] == tinker.__version__ == "0.38.0"
    deadline = time.monotonic() + HEARTBEAT_WAIT_S
    while time.monotonic() < deadline:
        now = _rest(server, f"/sessions/{session_id}", owner.api_key).json()
        if _when(now["last_heartbeat_at"]) > _when(first["last_heartbeat_at"]):
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"no heartbeat of the client's in {HEARTBEAT_WAIT_S} s: {now}")

    audit = httpx.get(f"{server.removesuffix('/tinker')}/v1/audit", headers=owner.headers).json()
    created = [e for e in audit["items"] if e["target"] == session_id]
    assert [e["operation"] for e in created] == ["tinker_create_session"], created
    assert not [e for e in audit["items"] if e["operation"] == "tinker_session_heartbeat"]

    service.close("success", detail="done").result()
    ended = _rest(server, f"/sessions/{session_id}", owner.api_key).json()
    assert (ended["state"], ended["ended_reason"]) == ("ended", "client finished: success: done")
    beat = _rest(server, "/session_heartbeat", owner.api_key, json={"session_id": session_id})
    assert beat.status_code == 410, beat.text


@pytest.mark.usefixtures("client_env")
def test_an_ended_sessions_410_stops_the_clients_heartbeat_loop(engine: Engine) -> None:
    service = tinker.ServiceClient()
    holder = service.holder
    with session_scope(engine) as s:  # ended from outside, as the idle timeout ends it
        s.execute(
            update(TrainingSession)
            .where(TrainingSession.id == holder.get_session_id())
            .values(state=SessionState.ENDED, ended_at=utcnow(), ended_reason="test")
        )
    task = holder._session_heartbeat_task
    assert task is not None
    deadline = time.monotonic() + HEARTBEAT_WAIT_S
    while not task.done() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert task.done() and task.exception() is None  # the loop returned on 410


@pytest.mark.usefixtures("client_env")
def test_another_projects_key_gets_404_on_the_session(server: str, engine: Engine) -> None:
    service = tinker.ServiceClient()
    session_id = service.holder.get_session_id()
    other = make_project(engine)
    for path, body in (
        (f"/sessions/{session_id}", None),
        ("/session_heartbeat", {"session_id": session_id}),
        (f"/sessions/{session_id}/finish", {"reason": {"type": "success"}, "detail": None}),
    ):
        answer = _rest(server, path, other.api_key, **({} if body is None else {"json": body}))
        assert answer.status_code == 404, (path, answer.text)
    assert session_id not in _rest(server, "/sessions", other.api_key).json()["sessions"]
    foreign = tinker.RestClient(api_key=f"tml-{other.api_key}")
    with pytest.raises(tinker.NotFoundError):
        foreign.get_session(session_id).result()
    service.close("success").result()


@pytest.mark.usefixtures("client_env")
def test_a_wrong_key_gets_401_from_the_client(server: str) -> None:
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(api_key="tml-ty_not-a-key").holder  # noqa: B018
    answer = httpx.get(f"{server}/api/v1/sessions", headers={"X-API-Key": "tml-ty_wrong"})
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthorized"


@pytest.mark.usefixtures("client_env")
def test_a_retried_create_makes_one_session_and_bad_input_names_its_field(
    server: str, owner: ProjectKey
) -> None:
    body = {"tags": ["a"], "user_metadata": None, "sdk_version": "0.38.0"}
    retry = {"X-API-Key": f"tml-{owner.api_key}", "X-Idempotency-Key": "stainless-python-retry-1"}
    first = httpx.post(f"{server}/api/v1/create_session", json=body, headers=retry).json()
    again = httpx.post(f"{server}/api/v1/create_session", json=body, headers=retry).json()
    assert first["session_id"] == again["session_id"]
    bad = _rest(server, "/create_session", owner.api_key, json={**body, "tags": "a"})
    assert bad.status_code == 422
    assert [d["loc"] for d in bad.json()["error"]["details"]] == [["body", "tags"]]
    elsewhere = _rest(server, "/create_session", owner.api_key, json={**body, "project_id": "x"})
    assert elsewhere.status_code == 422
    assert elsewhere.json()["error"]["details"][0]["loc"] == ["body", "project_id"]
