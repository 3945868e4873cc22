"""Issue 47, training clients: the official `tinker` client (0.38.0, unchanged, only
`TINKER_BASE_URL` and `TINKER_API_KEY`) creates a LoRA training client on a registered base
model; the server makes it a session job through the one door (it shows in `/v1/jobs`),
answers `create_model` through `retrieve_future` and `get_info`, and cancels the job when the
session ends (closed, or idle). Another project's key gets 404 on the model and its futures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinker
from sqlalchemy import Engine, select

from core.platform.db import session_scope
from core.platform.settings import Settings
from core.platform.tables import Job, SessionModel, SessionRequest, utcnow
from core.sessions import service as sessions
from tests.conftest import ProjectKey, make_project, settings_env
from tests.integration.conftest import serve_api

BASE = "tiny-llama"
ALIAS = "tiny-llama-short"
OTHER = "other-llama"


@pytest.fixture(scope="module")
def server(
    settings: Settings, models_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """An API whose registry offers `BASE`; its `/tinker` base URL. No worker: session jobs
    stay queued."""
    weights = str(models_root / "tinker-llama")
    registry = {
        BASE: {"path": weights, "seq_len": 384},
        ALIAS: {"path": weights, "seq_len": 256},  # the same weights, a shorter context
        OTHER: {"path": str(models_root / "other-llama"), "seq_len": 384},
    }
    env = {**settings_env(settings), "TORCHYARD_BASE_MODELS": json.dumps(registry)}
    with serve_api(env, tmp_path_factory.mktemp("tinker_models_api")) as base_url:
        yield f"{base_url}/tinker"


def _post(server: str, path: str, key: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(
        f"{server}/api/v1{path}", json=body, headers={"X-API-Key": f"tml-{key}", **headers}
    )


def _job(server: str, owner: ProjectKey, job_id: int) -> dict[str, Any]:
    v1 = server.removesuffix("/tinker")
    return httpx.get(f"{v1}/v1/jobs/{job_id}", headers=owner.headers).json()


@pytest.mark.usefixtures("client_env")
def test_the_client_creates_a_lora_training_client_served_by_a_session_job(
    server: str, owner: ProjectKey, engine: Engine
) -> None:
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(BASE, rank=8, seed=3, train_unembed=False)
    client = training.result(timeout=60)
    session_id = service.holder.get_session_id()
    assert client.model_id == f"{session_id}:train:0"
    info = client.get_info()
    assert (info.model_id, info.lora_rank, info.model_data.model_name) == (
        client.model_id,
        8,
        BASE,
    )

    with session_scope(engine) as s:
        model = s.get(SessionModel, client.model_id)
        assert model is not None
        job_id = model.job_id
    job = _job(server, owner, job_id)
    assert job["state"] == "queued"
    assert job["spec"]["session"] == {
        "session_id": session_id,
        "model_id": client.model_id,
        "base_model": BASE,
        "lora_rank": 8,
        "lora_seed": 3,
        "train_mlp": True,
        "train_attn": True,
        "train_unembed": False,
    }
    listed = httpx.get(f"{server.removesuffix('/tinker')}/v1/jobs", headers=owner.headers).json()
    assert job_id in [j["id"] for j in listed["items"]]

    service.close("success").result()  # the session ends: its job is cancelled
    assert _job(server, owner, job_id)["state"] == "cancelled"


@pytest.mark.usefixtures("client_env")
def test_another_projects_key_gets_404_on_the_model_and_its_futures(
    server: str, owner: ProjectKey, engine: Engine
) -> None:
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(BASE, rank=4).result(timeout=60)
    session_id = service.holder.get_session_id()
    with session_scope(engine) as s:
        request_id = s.scalars(
            select(SessionRequest.id).where(SessionRequest.session_id == session_id)
        ).one()
    mine = _post(server, "/retrieve_future", owner.api_key, {"request_id": request_id})
    assert mine.json() == {"model_id": client.model_id, "type": "create_model"}
    other = make_project(engine)
    body = {"session_id": session_id, "model_seq_id": 1, "base_model": BASE}
    for path, payload in (
        ("/get_info", {"model_id": client.model_id}),
        ("/retrieve_future", {"request_id": request_id}),
        ("/create_model", body),
    ):
        answer = _post(server, path, other.api_key, payload)
        assert answer.status_code == 404, (path, answer.text)
    # a `tinker://` path of this project's client, loaded into the other project's own client
    theirs = _post(server, "/create_session", other.api_key,
                   {"tags": [], "user_metadata": None, "sdk_version": "0.38.0"})  # fmt: skip
    made = _post(server, "/create_model", other.api_key,
                 {"session_id": theirs.json()["session_id"], "model_seq_id": 0,
                  "base_model": BASE, "lora_config": {"rank": 4}})  # fmt: skip
    assert made.status_code == 200, made.text
    path = f"tinker://{client.model_id}/weights/w"
    load = {"model_id": made.json()["model_id"], "seq_id": 1, "path": path, "optimizer": False}
    answer = _post(server, "/load_weights", other.api_key, load)
    assert answer.status_code == 404, answer.text
    run = httpx.get(f"{server}/api/v1/training_runs/{client.model_id}",
                    headers={"X-API-Key": f"tml-{other.api_key}"})  # fmt: skip
    assert run.status_code == 404, run.text
    service.close("success").result()


@pytest.mark.usefixtures("client_env")
def test_a_retried_create_model_makes_one_job_and_bad_input_names_its_field(
    server: str, owner: ProjectKey, engine: Engine
) -> None:
    session_id = tinker.ServiceClient().holder.get_session_id()
    body = {"session_id": session_id, "model_seq_id": 0, "base_model": BASE}
    retry = {"X-Idempotency-Key": "stainless-python-retry-7"}
    first = _post(server, "/create_model", owner.api_key, body, **retry).json()
    again = _post(server, "/create_model", owner.api_key, body, **retry).json()
    assert first == again
    with session_scope(engine) as s:
        models = s.scalars(select(SessionModel).where(SessionModel.session_id == session_id))
        assert len(models.all()) == 1

    unknown = _post(server, "/create_model", owner.api_key, {**body, "base_model": "tiny-lama"})
    assert unknown.status_code == 422
    detail = unknown.json()["error"]["details"][0]
    assert detail["loc"] == ["body", "base_model"] and "tiny-llama" in detail["msg"]
    rank = _post(server, "/create_model", owner.api_key, {**body, "lora_config": {"rank": 0}})
    assert rank.status_code == 422
    assert rank.json()["error"]["details"][0]["loc"] == ["body", "lora_config", "rank"]
    other_base = {**body, "base_model": BASE + "-x"}
    assert _post(server, "/create_model", owner.api_key, other_base).status_code == 422


@pytest.mark.usefixtures("client_env")
def test_create_via_load_makes_a_client_with_the_states_lora_whose_first_call_is_the_load(
    server: str, owner: ProjectKey, engine: Engine
) -> None:
    """`create_training_client_from_state`'s one request (`load_weights` with `session_id` and
    `model_seq_id`): a training client with the saving client's base model and LoRA, its
    session job, and the load queued as its seq 0; a retry makes one; a base model of other
    weights, another project's state and a mixed addressing are refused by field."""
    service = tinker.ServiceClient()
    source = service.create_lora_training_client(BASE, rank=4, seed=3, train_unembed=False)
    saved = f"tinker://{source.result(timeout=60).model_id}/weights/w"
    session_id = service.holder.get_session_id()
    body = {"session_id": session_id, "model_seq_id": 1, "path": saved, "optimizer": True}
    retry = {"X-Idempotency-Key": "stainless-python-retry-9"}
    first = _post(server, "/load_weights", owner.api_key, body, **retry)
    assert first.status_code == 200, first.text
    assert first.json() == _post(server, "/load_weights", owner.api_key, body, **retry).json()
    made = first.json()["model_id"]
    assert made == f"{session_id}:train:1"
    with session_scope(engine) as s:
        model = s.get(SessionModel, made)
        assert model is not None and (model.base_model, model.lora_rank) == (BASE, 4)
        job = s.get(Job, model.job_id)
        assert job is not None and job.state == "queued"
        lora = job.spec.session  # type: ignore[union-attr]
        assert (lora.lora_seed, lora.train_unembed, lora.train_mlp) == (3, False, True)
        calls = s.scalars(select(SessionRequest).where(SessionRequest.model_id == made)).all()
        assert [(c.kind, c.seq_id) for c in calls] == [("load_weights", 0)]
    alias = _post(server, "/load_weights", owner.api_key,
                  {**body, "model_seq_id": 2, "base_model": ALIAS})  # fmt: skip
    assert alias.status_code == 200, alias.text
    other = _post(server, "/load_weights", owner.api_key,
                  {**body, "model_seq_id": 3, "base_model": OTHER})  # fmt: skip
    assert other.status_code == 422
    assert other.json()["error"]["details"][0]["loc"] == ["body", "base_model"]
    both = _post(server, "/load_weights", owner.api_key,
                 {**body, "model_id": made, "seq_id": 1})  # fmt: skip
    assert both.status_code == 422, both.text
    assert both.json()["error"]["details"][0]["type"] == "load_addressing"  # a rule, by name
    stranger = make_project(engine)
    theirs = _post(server, "/create_session", stranger.api_key,
                   {"tags": [], "user_metadata": None, "sdk_version": "0.38.0"})  # fmt: skip
    foreign = {**body, "session_id": theirs.json()["session_id"], "model_seq_id": 0}
    assert _post(server, "/load_weights", stranger.api_key, foreign).status_code == 404
    service.close("success").result()


@pytest.mark.usefixtures("client_env")
def test_an_idle_session_cancels_its_job_and_fails_its_open_calls(
    server: str, owner: ProjectKey, engine: Engine
) -> None:
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(BASE, rank=4).result(timeout=60)
    session_id = service.holder.get_session_id()
    with session_scope(engine) as s:
        job_id = s.get(SessionModel, client.model_id).job_id  # type: ignore[union-attr]
        s.add(  # a call its job never answered
            SessionRequest(
                id="req_open_" + session_id[-8:],
                project_id=owner.project_id,
                session_id=session_id,
                model_id=client.model_id,
                seq_id=1,
                kind="optim_step",
                body=b"{}",
            )
        )
    with session_scope(engine) as s:
        ended = sessions.end_idle(session=s, idle_timeout_s=300, now=utcnow() + timedelta(hours=1))
        assert session_id in ended
        assert s.get(Job, job_id).state == "cancelled"  # type: ignore[union-attr]
    failed = _post(
        server, "/retrieve_future", owner.api_key, {"request_id": "req_open_" + session_id[-8:]}
    )
    assert failed.json() == {"error": "session ended", "category": "user"}
