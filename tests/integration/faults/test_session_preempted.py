"""Issue 47: preemption applies to training sessions. A session job on a worker of one slot is
preempted for a job of higher priority (the reconciler decides, as Celery beat runs it): its
program keeps the weights since the last save as it stops, the job goes back to the queue, and a
call the client makes meanwhile is answered `try_again` with Tinker's `paused_capacity` (the
client waits, as for Tinker's own capacity). Placed again once the other job is done, the
program resumes from the state it kept: the client's steps go on with the losses of a run that
was never interrupted (a second training client of the same seed, not preempted), and nothing is
applied twice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from celery import Celery
from sqlalchemy import Engine, select

from core.platform.db import session_scope
from core.platform.settings import Settings
from core.platform.tables import Job, JobEvent, RequestState, SessionModel, SessionRequest
from tests.conftest import ProjectKey, make_project, settings_env
from tests.integration.api.tinker.stalls import Stall
from tests.integration.conftest import serve_api
from tests.integration.workers.archives import STEPS_PY, open_gate, steps_spec, store_archive
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    preemption_beat,
    start_worker,
    submit,
    unique_queue,
    wait_for,
    wait_state,
)
from tests.support.sessions import (
    RANK,
    SEED,
    random_batches,
    session_llama_dir,
    tinker_datums,
)

pytestmark = [pytest.mark.long, pytest.mark.timeout(900)]
BASE = "session-llama"
WAIT_S = 300  # a first call waits for placement and the model's load


class Setup:
    def __init__(self, stall: Stall, pool: str, owner: ProjectKey, base_url: str) -> None:
        self.stall, self.pool, self.owner, self.base_url = stall, pool, owner, base_url


@pytest.fixture
def setup(
    settings: Settings,
    engine: Engine,
    celery_client: Celery,
    models_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: list[Worker],
) -> Iterator[Setup]:
    """An API offering `BASE` on a pool of one worker with one slot, and the client's
    environment (its key of a new project). No controller: the test reconciles, as beat."""
    model_dir = models_root / BASE
    if not (model_dir / "config.json").exists():
        session_llama_dir(model_dir)
    pool = unique_queue("session-preempt")
    registry = {BASE: {"path": str(model_dir), "seq_len": 128, "pool": pool}}
    env = {**settings_env(settings), "TORCHYARD_BASE_MODELS": json.dumps(registry)}
    owner = make_project(engine)
    for name in ("TINKER_CREDENTIAL_CMD", "TINKER_TAGS", "TINKER_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TINKER_API_KEY", f"tml-{owner.api_key}")
    fleet.append(
        start_worker(settings=settings, client=celery_client, queue=pool, log_dir=tmp_path, slots=1)
    )
    with serve_api(env, tmp_path) as base_url:
        monkeypatch.setenv("TINKER_BASE_URL", f"{base_url}/tinker")
        yield Setup(Stall(engine, fleet[0], tmp_path / "uvicorn.log"), pool, owner, base_url)


def _job_of(engine: Engine, model_id: str) -> int:
    with session_scope(engine) as s:
        model = s.get(SessionModel, model_id)
        assert model is not None
        return model.job_id


def _queued_forward(engine: Engine, model_id: str) -> str | None:
    """The id of `model_id`'s queued `forward` call, once stored."""
    with session_scope(engine) as s:
        return s.scalars(
            select(SessionRequest.id).where(
                SessionRequest.model_id == model_id,
                SessionRequest.kind == "forward",
                SessionRequest.state == RequestState.QUEUED,
            )
        ).one_or_none()


def test_a_preempted_session_says_paused_capacity_and_resumes_from_the_state_it_kept(
    setup: Setup, settings: Settings, engine: Engine, celery_client: Celery
) -> None:
    stall, pool = setup.stall, setup.pool
    beat = preemption_beat(settings, engine, celery_client, pool)

    batches = random_batches(4, SEED + 1)
    service = tinker.ServiceClient()
    client = stall.answer(
        service.create_lora_training_client(BASE, rank=RANK, seed=SEED, train_unembed=False), 60
    )
    losses = [stall.step(client, batch, WAIT_S) for batch in batches[:2]]  # never saved
    session_job = _job_of(engine, client.model_id)
    assert beat() == []  # nothing waits: nobody is preempted

    code = store_archive(engine, settings, setup.owner, {"steps.py": STEPS_PY})
    high = submit(engine, celery_client, setup.owner,
                  steps_spec(code, pool=pool, steps=2, priority=50, gate="go"))  # fmt: skip
    assert wait_for("the reconciler to preempt", beat, 30) == [session_job]
    wait_state(engine, high, ("running",), 120, stall.worker)  # in the session job's slot
    assert wait_state(engine, session_job, ("queued",), 60, stall.worker).attempt == 1

    # a call while the session waits for a slot is stored, and polled it says why it waits
    # (a `forward`: it changes nothing the next steps read)
    pending = client.forward(tinker_datums(batches[3]), "cross_entropy")
    request_id = wait_for("the call to be stored",
                          lambda: _queued_forward(engine, client.model_id), 60)  # fmt: skip
    polled = httpx.post(
        f"{setup.base_url}/tinker/api/v1/retrieve_future",
        json={"request_id": request_id},
        headers={"X-API-Key": f"tml-{setup.owner.api_key}"},
        timeout=60,
    )
    assert polled.status_code == 200, polled.text
    assert polled.json() == {
        "type": "try_again",
        "request_id": request_id,
        "queue_state": "paused_capacity",
        "queue_state_reason": "session job queued",
    }

    open_gate(settings, high, "go")
    assert wait_state(engine, high, TERMINAL, 120, stall.worker).state == "succeeded"
    stall.answer(pending, WAIT_S)  # placed again: the call runs
    losses += [stall.step(client, batch, WAIT_S) for batch in batches[2:]]
    with session_scope(engine) as s:
        job = s.get(Job, session_job)
        assert job is not None and (job.attempt, job.restarts_used) == (2, 0)
        preempted = s.scalars(
            select(JobEvent).where(JobEvent.job_id == session_job, JobEvent.kind == "preempted")
        ).all()
        assert [e.data["for_job"] for e in preempted] == [high]
        calls = s.scalars(
            select(SessionRequest).where(SessionRequest.model_id == client.model_id)
        ).all()
    assert {c.state for c in calls} == {RequestState.DONE}  # none failed, none left
    stall.answer(service.close("success"), 60)  # frees the slot for the twin

    # the same steps by a training client of the same seed that nobody preempted
    again = tinker.ServiceClient()
    twin = stall.answer(
        again.create_lora_training_client(BASE, rank=RANK, seed=SEED, train_unembed=False), 60
    )
    reference = [stall.step(twin, batch, WAIT_S) for batch in batches]
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    assert len(set(losses)) == 4  # it trained: each step's loss its own
    stall.answer(again.close("success"), 60)
