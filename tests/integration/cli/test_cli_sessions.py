"""Issue 47, sessions shown the Torchyard way: sessions made by the official `tinker` client
(unchanged, only `TINKER_BASE_URL` and `TINKER_API_KEY`) are listed by `GET /v1/sessions`, the
SDK's `client.sessions` and `torchyard sessions`, each with its training clients, the session job
serving each and its calls; `--state` filters; another project sees none of them (404)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinker
from sqlalchemy import Engine

from core.platform.settings import Settings
from tests.conftest import ProjectKey, make_project, settings_env
from tests.integration.conftest import cli_invoker, serve_api
from torchyard.client import Client
from torchyard.errors import NotFound

BASE = "tiny-llama"


@pytest.fixture(scope="module")
def server(
    settings: Settings, models_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """An API whose registry offers `BASE`, and no worker: session jobs stay queued."""
    registry = {BASE: {"path": str(models_root / "sessions-llama"), "seq_len": 384}}
    env = {**settings_env(settings), "TORCHYARD_BASE_MODELS": json.dumps(registry)}
    with serve_api(env, tmp_path_factory.mktemp("sessions_api")) as base_url:
        yield base_url


@pytest.fixture
def owner(engine: Engine) -> ProjectKey:
    return make_project(engine)


@pytest.fixture
def two_sessions(
    server: str, owner: ProjectKey, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str, str]:
    """(an active session with one training client of rank 8, its model id, a closed session
    with none), made by the official client."""
    for name in ("TINKER_CREDENTIAL_CMD", "TINKER_TAGS", "TINKER_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TINKER_BASE_URL", f"{server}/tinker")
    monkeypatch.setenv("TINKER_API_KEY", f"tml-{owner.api_key}")
    closed = tinker.ServiceClient(user_metadata={"run": "closed"})
    closed_id = closed.holder.get_session_id()
    closed.close("success").result()
    live = tinker.ServiceClient(user_metadata={"experiment": "sums-rl"})
    model = live.create_lora_training_client(BASE, rank=8).result(timeout=60)
    return live.holder.get_session_id(), model.model_id, closed_id


def test_sessions_are_listed_with_their_training_clients_jobs_and_calls(
    server: str, owner: ProjectKey, two_sessions: tuple[str, str, str], tmp_path: Path
) -> None:
    live_id, model_id, closed_id = two_sessions
    with Client(server, api_key=owner.api_key) as client:
        listed = client.sessions.list().items
        assert [s.id for s in listed] == [live_id, closed_id]  # newest first
        live, closed = listed
        assert (live.state, closed.state) == ("active", "ended")
        assert live.user_metadata == {"experiment": "sums-rl"}
        assert closed.ended_reason is not None and "success" in closed.ended_reason
        (model,) = live.models
        assert (model.model_id, model.base_model, model.lora_rank) == (model_id, BASE, 8)
        assert model.job_state == "queued"  # no worker here
        job = client.jobs.get(model.job_id)
        assert job.spec["session"]["model_id"] == model_id
        assert live.calls == {"done": 1}  # create_model, answered by the API itself
        assert closed.models == [] and closed.calls == {}
        assert [s.id for s in client.sessions.list(state="ended").items] == [closed_id]
        assert client.sessions.get(live_id) == live

    cli = cli_invoker(server, owner.api_key, tmp_path, COLUMNS="80")
    table = cli("sessions")
    assert table.exit_code == 0, table.output
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:] if line}
    assert rows[live_id][1:5] == ["-", "active", "1", "-"]  # no name, 1 model, no step yet
    assert rows[closed_id][1:4] == ["-", "ended", "0"]
    as_json = cli("sessions", "list", "--state", "active", "--json")
    assert [s["id"] for s in json.loads(as_json.stdout)] == [live_id]
    shown = cli("sessions", "show", live_id)
    assert shown.exit_code == 0, shown.output
    assert model_id in shown.stdout and "metadata: experiment=sums-rl" in shown.stdout


def test_another_projects_key_sees_no_session(
    server: str, engine: Engine, two_sessions: tuple[str, str, str]
) -> None:
    live_id, _, _ = two_sessions
    other = make_project(engine)
    answer: Any = httpx.get(f"{server}/v1/sessions", headers=other.headers).json()
    assert answer == {"items": [], "next_offset": None}
    with Client(server, api_key=other.api_key) as client, pytest.raises(NotFound):
        client.sessions.get(live_id)
