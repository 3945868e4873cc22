"""Issue 47's fault: a training session's worker SIGKILLed while its program holds a
`forward_backward`. With the official client: that call's future fails with a `server`-category
error (documented: a call a lost program held is never run again); the reconciler requeues the
session job, the other worker places it again, and the program resumes from the session's last
saved state, so the next steps have the losses of a run that went on from that save: the
optimizer step after the save, lost with the worker, is not applied, and nothing is applied
twice."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tinker
from celery import Celery
from sqlalchemy import Engine, select

from core.platform.db import session_scope
from core.platform.settings import Settings
from core.platform.tables import RequestState, SessionRequest
from tests.conftest import ProjectKey, make_project, settings_env
from tests.integration.api.tinker.stalls import Stall
from tests.integration.conftest import serve_api
from tests.integration.workers.controllers import Controller, start_controller
from tests.integration.workers.helpers import (
    Worker,
    kill_tree,
    start_worker,
    unique_queue,
    wait_for,
)
from tests.support.figures import record
from tests.support.sessions import (
    RANK,
    SEED,
    random_batches,
    session_llama_dir,
    tinker_datums,
)

pytestmark = [pytest.mark.long, pytest.mark.timeout(900)]
BASE = "session-llama"
WAIT_S = 300  # a first call waits for placement and the model's load; a lost one for a requeue
# The lost worker's row goes stale (worker_timeout_s 10 s), a reconcile requeues the job, the
# other worker claims it and its program loads the model and the saved state.
ANSWERING_AGAIN_WITHIN_S = 60.0


@pytest.fixture
def setup(
    settings: Settings,
    engine: Engine,
    celery_client: Celery,
    models_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: list[Worker],
    controllers: list[Controller],
) -> Iterator[tuple[Stall, list[Worker]]]:
    """An API offering `BASE` on a pool of two workers, a controller, and the client's
    environment (its key of a new project)."""
    model_dir = models_root / BASE
    if not (model_dir / "config.json").exists():
        session_llama_dir(model_dir)
    pool = unique_queue("session-kill")
    registry = {BASE: {"path": str(model_dir), "seq_len": 128, "pool": pool}}
    env = {**settings_env(settings), "TORCHYARD_BASE_MODELS": json.dumps(registry)}
    owner: ProjectKey = make_project(engine)
    for name in ("TINKER_CREDENTIAL_CMD", "TINKER_TAGS", "TINKER_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TINKER_API_KEY", f"tml-{owner.api_key}")
    for _ in range(2):
        fleet.append(
            start_worker(settings=settings, client=celery_client, queue=pool, log_dir=tmp_path)
        )
    controller = start_controller(controllers, settings, tmp_path)
    with serve_api(env, tmp_path) as base_url:
        monkeypatch.setenv("TINKER_BASE_URL", f"{base_url}/tinker")
        stall = Stall(engine, fleet[0], tmp_path / "uvicorn.log", controller)
        stall.extra = [fleet[1].log_path]
        yield stall, fleet


def _program(worker: Worker) -> psutil.Process | None:
    """The session program under `worker` (the rank: a process with `RANK` in its environment
    that runs `trainer.session`, not torchrun or the sandbox around it), if it runs one."""
    for proc in psutil.Process(worker.proc.pid).children(recursive=True):
        try:
            command = proc.cmdline()
            if (
                proc.name() != "bwrap"
                and command[1:3] == ["-m", "trainer.session"]
                and "RANK" in proc.environ()
            ):
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, IndexError):
            continue
    return None


def _running(engine: Engine, model_id: str) -> Callable[[], bool]:
    """Whether one of `model_id`'s `forward_backward` calls is running (handed over)."""

    def probe() -> bool:
        with session_scope(engine) as s:
            states = s.scalars(
                select(SessionRequest.state).where(
                    SessionRequest.model_id == model_id,
                    SessionRequest.kind == "forward_backward",
                )
            ).all()
        return RequestState.RUNNING in states

    return probe


def test_a_killed_session_worker_fails_the_held_call_and_resumes_from_the_saved_state(
    setup: tuple[Stall, list[Worker]], engine: Engine
) -> None:
    stall, workers = setup
    batches = random_batches(4)
    service = tinker.ServiceClient()
    client = stall.answer(
        service.create_lora_training_client(BASE, rank=RANK, seed=SEED, train_unembed=False), 60
    )
    before = [stall.step(client, batch, WAIT_S) for batch in batches[:2]]
    stall.answer(client.save_state("two"), WAIT_S)
    after_save = stall.step(client, batches[2], WAIT_S)  # applied, then lost with the worker

    holder = next(w for w in workers if _program(w) is not None)
    program = _program(holder)
    assert program is not None
    program.suspend()  # it takes the next call and never answers: the worker dies first
    try:
        held = client.forward_backward(tinker_datums(batches[3]), "cross_entropy")
        wait_for("the relay to hand the call over", _running(engine, client.model_id), 60,
                 explain=stall.explain)  # fmt: skip
        killed_at = kill_tree(holder, at_least=2)
    finally:
        if program.is_running():  # the test failed before the kill: the worker stops it
            program.resume()

    with pytest.raises(tinker.RequestFailedError) as lost:
        stall.answer(held, WAIT_S)
    answered_in_s = time.time() - killed_at
    assert lost.value.category == "server"
    assert "lost before answering this call" in str(lost.value), str(lost.value)

    # the other worker serves it, from the save: batch 2 again has the loss it had after it
    again = stall.step(client, batches[2], WAIT_S)
    record("session worker killed -> its held call failed", answered_in_s,
           ANSWERING_AGAIN_WITHIN_S)  # fmt: skip
    assert answered_in_s < ANSWERING_AGAIN_WITHIN_S
    np.testing.assert_allclose(again, after_save, rtol=1e-5)
    assert len(set([*before, after_save])) == 3  # it trained: each step's loss its own
    with session_scope(engine) as s:
        calls = s.scalars(
            select(SessionRequest).where(SessionRequest.model_id == client.model_id)
        ).all()
    assert [c.state for c in calls if c.state not in (RequestState.DONE, RequestState.FAILED)] == []
    assert sum(c.state == RequestState.FAILED for c in calls) == 1  # the held call, only
    stall.answer(service.close("success"), 60)
