"""Fixtures of the modules that drive a session job through the official `tinker` client: a
real API whose registry offers a small Llama (`BASE`) and a model that fails at load
(`BROKEN`) on a pool of their own, a real Celery worker serving that pool, the reconcile loop,
a `Stall` that says why an answer did not come, a project and the client's environment (only
`TINKER_BASE_URL` and `TINKER_API_KEY`). Module-scoped: each module gets its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from tests.conftest import ProjectKey, make_project, settings_env
from tests.integration.api.tinker.stalls import Stall
from tests.integration.conftest import serve_api
from tests.integration.workers.controllers import Controller, start_controller
from tests.integration.workers.helpers import Worker, start_worker, unique_queue
from tests.support.sessions import BASE, BROKEN, SEQ_LEN, session_llama_dir


@pytest.fixture(scope="module")
def model_dir(models_root: Path) -> Path:
    return session_llama_dir(models_root / BASE)


@pytest.fixture(scope="module")
def pool() -> str:
    return unique_queue("sessions")


@pytest.fixture(scope="module")
def api_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tinker_sessions_api")


@pytest.fixture(scope="module")
def server(settings: Settings, model_dir: Path, pool: str, api_logs: Path) -> Iterator[str]:
    """An API whose registry offers `BASE` on the pool `pool`; its `/tinker` base URL."""
    broken = model_dir.parent / BROKEN  # no model files: its session job fails at load
    broken.mkdir(exist_ok=True)
    registry = {
        BASE: {"path": str(model_dir), "seq_len": SEQ_LEN, "pool": pool},
        BROKEN: {"path": str(broken), "seq_len": SEQ_LEN, "pool": pool},
    }
    env = {**settings_env(settings), "TORCHYARD_BASE_MODELS": json.dumps(registry)}
    with serve_api(env, api_logs) as base_url:
        yield f"{base_url}/tinker"


@pytest.fixture(scope="module")
def worker(
    settings: Settings, celery_client: Celery, pool: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    w = start_worker(
        settings=settings,
        client=celery_client,
        queue=pool,
        log_dir=tmp_path_factory.mktemp("session_worker"),
    )
    yield w
    w.stop()


@pytest.fixture(scope="module")
def controller(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Controller]:
    """The reconcile loop, as every deployment runs one: it re-sends a session job whose
    dispatch message was lost and ends idle sessions."""
    started: list[Controller] = []
    yield start_controller(started, settings, tmp_path_factory.mktemp("session_controller"))
    for c in started:
        c.stop()


@pytest.fixture(scope="module")
def stall(engine: Engine, worker: Worker, controller: Controller, api_logs: Path) -> Stall:
    return Stall(engine, worker, api_logs / "uvicorn.log", controller)


@pytest.fixture(scope="module")
def owner(engine: Engine) -> ProjectKey:
    return make_project(engine)


@pytest.fixture
def client_env(server: str, owner: ProjectKey, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TINKER_CREDENTIAL_CMD", "TINKER_TAGS", "TINKER_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TINKER_BASE_URL", server)
    monkeypatch.setenv("TINKER_API_KEY", f"tml-{owner.api_key}")
