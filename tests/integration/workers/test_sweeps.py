"""A sweep that trains for real: the API (in this process), a controller and a Celery worker
with two CPU slots (subprocesses), torchrun and the trainer, Postgres, Redis and Optuna's study
in Postgres. A small GPT on the session corpus, where the learning rate decides the loss; ASHA
prunes the trials that lag; the worker is SIGKILLed mid-sweep and replaced, and no trial is
lost. An entrypoint sweep reads its values with `torchyard.train.params()`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from core.jobs import spec_yaml
from core.platform.settings import Settings
from core.platform.tables import JobState
from tests.conftest import ProjectKey
from tests.integration.workers.archives import store_archive
from tests.integration.workers.controllers import Controller, start_controller
from tests.integration.workers.helpers import (
    Worker,
    job_events,
    job_nodes,
    job_row,
    metric_series,
    start_worker,
    tiny_spec,
    unique_queue,
    wait_for,
)
from tests.support.doc_blocks import README, yaml_blocks

SWEEP_S = 600.0  # 8 trials, 2 at a time, on 2 shared cores, with a worker's death in the middle
START_S = 120.0


@pytest.fixture(scope="module")
def client(settings: Settings) -> Any:
    with TestClient(create_app(settings), raise_server_exceptions=True) as test_client:
        yield test_client


def _sweep(client: TestClient, project: ProjectKey, sweep_id: int) -> dict[str, Any]:
    return dict(client.get(f"/v1/sweeps/{sweep_id}", headers=project.headers).json())


def _trials(client: TestClient, project: ProjectKey, sweep_id: int) -> list[dict[str, Any]]:
    answer = client.get(f"/v1/sweeps/{sweep_id}/trials", headers=project.headers)
    return list(answer.json()["items"])


@pytest.mark.timeout(2 * SWEEP_S)  # its waits are bounded by SWEEP_S each, past the default
def test_an_asha_sweep_finds_the_learning_rate_prunes_laggards_and_survives_its_worker(
    client: TestClient,
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    worker_logs: Path,
    controllers: list[Controller],
    fleet: list[Worker],
) -> None:
    queue = unique_queue("sweep")
    interval = 5  # eval_loss every 5 steps: the pruner's report interval
    base = tiny_spec(
        pool=queue,
        dataset_id=dataset_id,
        train={"max_steps": 40},
        eval={"interval_steps": interval, "num_batches": 2},
        checkpoint={"interval_steps": 10},
        retries={"max_restarts": 2},
    ).model_dump(mode="json")
    spec = {
        "name": "lr",
        "base": base,
        "space": {"optim.lr": {"log_uniform": [1e-5, 3e-2]}},
        "metric": "eval_loss",
        "searcher": "tpe",
        "seed": 3,
        "pruner": {"kind": "asha", "min_resource": interval, "reduction_factor": 2},
        "max_trials": 8,
        "max_concurrent_trials": 2,
    }
    # A pruned trial stops through SIGTERM and writes its stop checkpoint (asserted below); the
    # suite's 5 s cancel grace ran out on a loaded CI host and SIGKILLed three of them before it.
    patient = {"TORCHYARD_CANCEL_GRACE_S": "60"}
    worker = start_worker(
        settings=settings, client=celery_client, queue=queue, log_dir=worker_logs, slots=2,
        extra_env=patient,
    )  # fmt: skip
    fleet.append(worker)
    start_controller(controllers, settings, worker_logs)
    answer = client.post("/v1/sweeps", json=spec, headers=project.headers)
    assert answer.status_code == 201, answer.text
    sweep_id = answer.json()["id"]

    def a_trial_mid_run() -> dict[str, Any] | None:
        trials = _trials(client, project, sweep_id)
        ended = [t for t in trials if t["state"] != "running"]
        running = [
            t
            for t in trials
            if t["state"] == "running"
            and t["job_state"] == JobState.RUNNING  # training, not being pruned
            and 12 <= (t["current_step"] or 0) <= 30  # past a checkpoint, far from its end
        ]
        return running[0] if len(ended) >= 2 and running else None

    victim = wait_for("a trial past a checkpoint after two ended", a_trial_mid_run, SWEEP_S)
    worker.proc.kill()  # SIGKILL: the worker dies with its trials' attempts
    worker.proc.wait()
    fleet.append(
        start_worker(
            settings=settings,
            client=celery_client,
            queue=queue,
            log_dir=worker_logs,
            slots=2,
            extra_env=patient,
        )
    )

    def ended() -> dict[str, Any] | None:
        sweep = _sweep(client, project, sweep_id)
        return sweep if sweep["state"] != "running" else None

    sweep = wait_for("the sweep to end", ended, SWEEP_S, poll_s=1.0)
    trials = _trials(client, project, sweep_id)
    assert sweep["state"] == "succeeded", sweep
    # no trial lost: eight ended, each completed or pruned, none failed or cancelled
    assert [t["number"] for t in trials] == list(range(8))
    assert {t["state"] for t in trials} <= {"succeeded", "pruned"}, trials
    # the killed one went on in a second attempt (unless the pruner had just stopped it)
    final = next(t for t in trials if t["number"] == victim["number"])
    assert job_row(engine, victim["job_id"]).attempt >= 2 or final["state"] == "pruned", final
    # the learning rate decides: the best trial's lr is the best of those drawn, or near it
    lrs = sorted(t["params"]["optim.lr"] for t in trials)
    best_lr = sweep["best"]["params"]["optim.lr"]
    assert best_lr >= 1e-3 and best_lr >= lrs[len(lrs) // 2], (best_lr, lrs)
    completed = [t for t in trials if t["state"] == "succeeded"]
    assert sweep["best"]["value"] == min(t["value"] for t in completed)
    assert sweep["best"]["checkpoint_id"] is not None
    # pruned before their last step, and stopped by it: a trial pruned well before its end
    # (by 4 report intervals) does not train to its end. How soon after the decision it stops
    # is a latency (README: 0-3 steps on an idle host; 10 seen under the suite's load).
    pruned = [t for t in trials if t["state"] == "pruned"]
    stopped_with_checkpoint = 0  # pruned trials whose stop checkpoint was asserted
    assert any(t["pruned_step"] < 40 for t in pruned), trials  # one at least before its end
    for t in pruned:  # (a trial may also lose at its last report: pruned at step 40)
        assert t["pruned_step"] <= 40 and t["pruned_rung"] is not None
        decision = next(
            e for e in job_events(engine, t["job_id"]) if (e.data or {}).get("cause") == "pruned"
        )
        trained_to = decision.data["current_step"] or decision.data["step"]
        last = metric_series(engine, t["job_id"], "loss")[-1].step
        assert last >= trained_to, (t, decision.data, last)
        if trained_to <= 40 - 4 * interval:
            assert last < 40, (t, decision.data, last)
        # it stopped at a checkpoint boundary, not killed mid-write: its stop checkpoint. Not
        # for a trial whose trainer died with the SIGKILLed worker (the victim's neighbour in
        # the other slot, pruned afterwards from what it had reported): nothing stopped it.
        died = any(
            n.worker == worker.name and n.exit_code is None for n in job_nodes(engine, t["job_id"])
        )
        saved = [e.data["step"] for e in job_events(engine, t["job_id"]) if e.kind == "checkpoint"]
        assert died or (saved and max(saved) >= last), (t, saved, last)
        stopped_with_checkpoint += not died
        ended = job_row(engine, t["job_id"])
        assert ended.state == JobState.PRUNED, (t, ended.state)
        assert decision.message.startswith(f"pruned by sweep {sweep_id} at step {t['pruned_step']}")
        assert ended.error == decision.message  # why, on the job itself
    assert stopped_with_checkpoint, "every pruned trial died with the worker: nothing checked"


PARAMS_PY = """
import math
import time

import torchyard.train as ty

values = ty.params()
lr = float(values["lr"])
for step in range(1, 26):
    if ty.should_stop():  # pruned: the job is cancelling
        break
    time.sleep(0.2)
    # the closer lr is to 1e-3, the lower the loss
    ty.report(step, loss=(math.log10(lr) + 3) ** 2 + 1.0 / step)
"""
SCRIPT_STEPS = 25


def test_an_entrypoint_sweep_gives_each_trial_its_values_through_params_and_prunes_it(
    client: TestClient,
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    worker_logs: Path,
    controllers: list[Controller],
    fleet: list[Worker],
) -> None:
    """A team's own program as the trial: its values come through `ty.params()`, its reported
    `loss` goes to the ASHA pruner as it is ingested, and a pruned trial's program sees
    `should_stop()` and ends before its last step. One trial at a time, so every trial after
    the first meets a rung with a value to lose to."""
    queue = unique_queue("sweep-script")
    code_id = store_archive(engine, settings, project, {"train.py": PARAMS_PY})
    choices = [1e-5, 1e-4, 1e-3, 1e-1]
    spec = {
        "name": "script-lr",
        "base": {
            "name": "script",
            "entrypoint": {"code": code_id, "command": ["python", "train.py"]},
            "resources": {"pool": queue},
        },
        "space": {"entrypoint.params.lr": {"choice": choices}},
        "metric": "loss",
        "searcher": "grid",
        "pruner": {"kind": "asha", "min_resource": 5, "reduction_factor": 2},
        "max_trials": len(choices),
        "max_concurrent_trials": 1,
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
    sweep = wait_for(
        "the script sweep to end",
        lambda: ((s := _sweep(client, project, sweep_id))["state"] != "running" and s) or None,
        START_S * 3,
        poll_s=0.5,
    )
    trials = _trials(client, project, sweep_id)
    assert sweep["state"] == "succeeded", (sweep, trials)
    assert sorted(t["params"]["entrypoint.params.lr"] for t in trials) == choices
    assert sweep["best"]["params"] == {"entrypoint.params.lr": 1e-3}
    completed = [t for t in trials if t["state"] == "succeeded"]
    pruned = [t for t in trials if t["state"] == "pruned"]
    assert len(completed) + len(pruned) == len(choices), trials
    for t in completed:  # a verdict that came after the run's end did not prune it
        assert t["pruned_step"] is None and t["job_state"] == "succeeded", t
        lr = t["params"]["entrypoint.params.lr"]
        assert t["value"] == pytest.approx((math.log10(lr) + 3) ** 2 + 1.0 / SCRIPT_STEPS)
    assert pruned, trials  # the grid's order is the seed's; it is not best-first
    for t in pruned:  # stopped by the pruner: well before the end (3 s), before its last step
        assert t["job_state"] == "pruned", t
        last = metric_series(engine, t["job_id"], "loss")[-1].step
        assert t["pruned_step"] < SCRIPT_STEPS, t
        if t["pruned_step"] <= SCRIPT_STEPS - 15:
            assert last < SCRIPT_STEPS, (t, last)
        print(f"lr {t['params']['entrypoint.params.lr']}: pruned at {t['pruned_step']}, "
              f"last step {last}")  # fmt: skip
        assert t["params"]["entrypoint.params.lr"] != 1e-3
        assert job_row(engine, t["job_id"]).state == JobState.PRUNED


README_SWEEP_S = 300.0


def test_the_readme_sweep_runs_as_written_at_a_small_scale(
    client: TestClient,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    worker_logs: Path,
    controllers: list[Controller],
    fleet: list[Worker],
) -> None:
    """The README's sweep text itself (issue 45: as written it was refused), on the embedded
    default's unpriced pool, with only its scale overridden: 2 trials of a 2-layer GPT, 20
    steps each. It is accepted and ends with a best trial and a checkpoint to export."""
    block = next(text for _, text in yaml_blocks(README) if "space:" in text)
    spec = spec_yaml.parse(block).data
    queue = unique_queue("readme-sweep")
    small = tiny_spec(pool=queue, dataset_id=dataset_id).model_dump(mode="json", include={"model"})
    spec["base"] = {
        **spec["base"],
        **small,
        "data": {"dataset": dataset_id},
        "train": {**spec["base"]["train"], "max_steps": 20, "micro_batch_size": 8},
        "eval": {"interval_steps": 5, "num_batches": 2},
        "resources": {"pool": queue},
    }
    spec["space"]["optim.warmup_steps"] = {"int": [0, 10, 5]}  # within the 20 steps
    spec |= {"max_trials": 2, "max_concurrent_trials": 2}
    spec["pruner"] |= {"min_resource": 5}
    worker = start_worker(
        settings=settings, client=celery_client, queue=queue, log_dir=worker_logs, slots=2
    )
    fleet.append(worker)
    start_controller(controllers, settings, worker_logs)
    answer = client.post("/v1/sweeps", json=spec, headers=project.headers)
    assert answer.status_code == 201, answer.text
    sweep_id = answer.json()["id"]

    def ended() -> dict[str, Any] | None:
        sweep = _sweep(client, project, sweep_id)
        return sweep if sweep["state"] != "running" else None

    sweep = wait_for("the README sweep to end", ended, README_SWEEP_S, poll_s=1.0)
    trials = _trials(client, project, sweep_id)
    assert sweep["state"] == "succeeded", sweep
    assert [t["number"] for t in trials] == [0, 1]
    assert set(trials[0]["params"]) == set(spec["space"])
    assert sweep["best"]["checkpoint_id"] is not None
    export = client.post(
        f"/v1/jobs/{sweep['best']['job_id']}/checkpoints/{sweep['best']['checkpoint_id']}/export",
        headers=project.headers,
    )
    assert export.status_code == 202, export.text  # what `torchyard sweep best` suggests
