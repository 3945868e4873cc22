"""A sweep of GRPO jobs (issue 48) that trains for real: the API (in this process), a
controller and a Celery worker with two CPU slots, torchrun and the trainer, Postgres, Redis and
Optuna's study in Postgres. Two learning rates of a GRPO job with a team's `python` grader
(`tests.support.grpo`), judged by the held-out reward and maximised: the trial whose rate lets
the reward rise is the best, and each trial's value is its last `eval_reward`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.main import create_app
from core.datasets import service as datasets
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.controllers import Controller, start_controller
from tests.integration.workers.helpers import Worker, start_worker, unique_queue, wait_for
from tests.support.grpo import grpo_job, write_prompts

SWEEP_S = 400.0
pytestmark = pytest.mark.timeout(SWEEP_S + 120)


@pytest.fixture(scope="module")
def client(settings: Settings) -> Any:
    with TestClient(create_app(settings), raise_server_exceptions=True) as test_client:
        yield test_client


def test_a_grpo_sweep_over_the_learning_rate_maximises_the_held_out_reward(
    client: TestClient,
    session: Session,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    models_root: Path,
    worker_logs: Path,
    controllers: list[Controller],
    fleet: list[Worker],
) -> None:
    queue = unique_queue("sweep-grpo")
    (models_root / "sweep-prompts").mkdir(exist_ok=True)
    prompts = write_prompts(models_root / "sweep-prompts" / "prompts.jsonl")
    dataset = datasets.register(
        session=session,
        settings=settings,
        project_id=project.project_id,
        name="sweep-prompts",
        uri=str(prompts),
    )
    assert dataset.format == "prompt"
    base = grpo_job(dataset=dataset.id, pool=queue, max_steps=20)
    base["parallelism"] = {"strategy": "single"}
    base["resources"]["procs_per_node"] = 1
    rates = [1e-5, 1e-2]
    spec = {
        "name": "grpo-lr",
        "base": base,
        "space": {"optim.lr": {"choice": rates}},
        "metric": "eval_reward",
        "direction": "maximize",
        "searcher": "grid",
        "max_trials": len(rates),
        "max_concurrent_trials": 2,
    }
    fleet.append(
        start_worker(
            settings=settings, client=celery_client, queue=queue, log_dir=worker_logs, slots=2
        )
    )
    start_controller(controllers, settings, worker_logs)
    answer = client.post("/v1/sweeps", json=spec, headers=project.headers)
    assert answer.status_code == 201, answer.text
    sweep_id = answer.json()["id"]

    def ended() -> dict[str, Any] | None:
        sweep = dict(client.get(f"/v1/sweeps/{sweep_id}", headers=project.headers).json())
        return sweep if sweep["state"] != "running" else None

    sweep = wait_for("the GRPO sweep to end", ended, SWEEP_S, poll_s=0.5)
    trials = client.get(f"/v1/sweeps/{sweep_id}/trials", headers=project.headers).json()["items"]
    assert sweep["state"] == "succeeded", (sweep, trials)
    values = {t["params"]["optim.lr"]: t["value"] for t in trials}
    assert sorted(values) == rates and all(t["state"] == "succeeded" for t in trials), trials
    for t in trials:  # a trial's value is its job's last held-out reward
        job = client.get(f"/v1/jobs/{t['job_id']}", headers=project.headers).json()
        assert t["value"] == job["latest_metrics"]["eval_reward"], (t, job["latest_metrics"])
    assert values[1e-2] > values[1e-5] + 0.2, values
    assert sweep["best"]["params"] == {"optim.lr": 1e-2} and sweep["best"]["value"] == max(
        values.values()
    )
