"""Faults of multi-node gangs with real Celery workers on this host: a lost node, a node's
worker shutting down, a crashing node's trainer, cancel while assembling and while running."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.faults.test_gang import STEPS, gang_spec, nodes_of, start, workers
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    group_gone,
    job_events,
    job_row,
    kill_ranks_after_checkpoint,
    launches,
    metric_series,
    run_to_success,
    start_worker,
    submit,
    unique_queue,
    wait_for,
    wait_state,
    wait_step,
)
from tests.support.figures import bound, record

__all__ = ["workers"]  # a fixture

# 2-4 min each on a busy 2-core host; a test's own waits (the gang's first steps 180 s, the
# lost node's end 60 s, the restarted gang's end 240 s) bound each phase, so the test as a whole
# may take longer than pytest-timeout's default 300 s on a loaded CI host (it did once).
pytestmark = [pytest.mark.long, pytest.mark.timeout(600)]
CONTROL_QUEUE = "torchyard.control"  # workers/app.py's (importing it builds an app)
HEARTBEAT_TIMEOUT_S = 3.0  # the reaper's silence threshold once a node is lost
GONE_WITHIN_S = 10.0  # a cancel ends the job and every node's processes within this
# A gang that checkpoints every 4 steps (all kept) and may restart once.
RESTARTABLE: dict[str, Any] = {
    "checkpoint": {"interval_steps": 4, "keep_last": 10},
    "retries": {"max_restarts": 1},
}


def test_losing_a_node_restarts_the_whole_gang_from_its_checkpoint_with_every_step_once(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    dataset_id: str,
    workers: list[Worker],
) -> None:
    queue = unique_queue("gangkill")
    for _ in range(2):
        workers.append(start(settings, celery_client, queue, worker_logs, {}))
    spec = gang_spec(queue, dataset_id, nodes=2, procs=1, **RESTARTABLE)
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, 6, 180, "the gang")
    node1 = nodes_of(engine, job_id, 1)[1]
    (victim,) = [w for w in workers if w.name == node1.worker]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    (lost,) = [e for e in launches(job_events(engine, job_id)) if e.data["node_rank"] == 1]
    # Parent-death signal: the lost node's torchrun goes with its worker. The surviving
    # node's torchrun waits in torchrun's exit barrier for the lost one, until the reaper
    # ends the attempt and its worker kills it.
    wait_for("the lost node's trainer to end", lambda: group_gone(lost.data["pgid"]), 60)

    # A replacement node, and the reaper as deployed (beat in a control worker), which notices
    # the silent node even though the surviving node's worker is fine.
    fast = {"TORCHYARD_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S)}
    workers.append(start(settings, celery_client, queue, worker_logs, fast))
    workers.append(
        start_worker(
            settings=settings,
            client=celery_client,
            queue=CONTROL_QUEUE,
            log_dir=worker_logs,
            extra_env=fast,
            beat=True,
        )
    )
    job = wait_state(engine, job_id, TERMINAL, 240, workers[-2])
    assert job.state == "succeeded", job.error
    events = job_events(engine, job_id)
    (restarting,) = [e for e in events if e.state_to == "restarting"]
    assert restarting.attempt == 1 and restarting.data["cause"] == "failure"
    # The whole gang ran again: two launches per attempt, one per node.
    assert sorted((e.attempt, e.data["node_rank"]) for e in launches(events)) == [
        (1, 0), (1, 1), (job.attempt, 0), (job.attempt, 1),
    ]  # fmt: skip
    assert all(group_gone(e.data["pgid"]) for e in launches(events))
    recorded = [e.data["step"] for e in events if e.kind == "checkpoint" and e.attempt == 1]
    resumed = next(e for e in events if e.state_to == "running" and e.attempt == job.attempt)
    assert resumed.data["start_step"] == max(recorded)

    reference_spec = gang_spec(queue, dataset_id, nodes=1, procs=2)
    reference = run_to_success(engine, celery_client, project, reference_spec, workers[-2], 180)
    points = metric_series(engine, job_id, "loss")
    assert [p.step for p in points] == list(range(1, STEPS + 1))  # every step exactly once
    expected = metric_series(engine, reference.id, "loss")
    assert [p.value for p in points] == pytest.approx([p.value for p in expected], rel=1e-5)
    print(f"restart cause: {restarting.message}; resumed at step {max(recorded)}")


def test_a_node_s_worker_shutdown_hands_the_whole_gang_back_and_it_resumes(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    dataset_id: str,
    workers: list[Worker],
) -> None:
    queue = unique_queue("gangterm")
    for _ in range(2):
        workers.append(start(settings, celery_client, queue, worker_logs, {}))
    long_steps = 200
    spec = gang_spec(
        queue,
        dataset_id,
        nodes=2,
        procs=1,
        train={"max_steps": long_steps},
        eval={"interval_steps": 100},
        checkpoint={"interval_steps": 50, "keep_last": 10},
    )
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, 10, 180, "the gang")
    node1 = nodes_of(engine, job_id, 1)[1]
    (leaving,) = [w for w in workers if w.name == node1.worker]
    leaving.stop()  # warm shutdown, as a deploy does: the node's trainer checkpoints
    first = launches(job_events(engine, job_id))
    for launch in first:  # the other node stops too, instead of waiting in torchrun
        wait_for(f"node {launch.data['node_rank']}'s trainer to end",
                 lambda pgid=launch.data["pgid"]: group_gone(pgid), 30)  # fmt: skip
    # the worker records the hand-back after its trainer ended: wait for the record itself
    wait_for(
        "the gang to be handed back",
        lambda: any(e.state_to == "restarting" for e in job_events(engine, job_id)),
        60,
    )
    events = job_events(engine, job_id)
    (handed_back,) = [e for e in events if e.state_to == "restarting"]
    assert handed_back.data["cause"] == "shutdown"  # not a failure: no restart budget used
    stopped_at = max(e.data["step"] for e in events if e.kind == "checkpoint")

    # On the threads pool: the handed-back node's message is already queued, and a solo pool
    # that takes it first answers no ping until the job ends (CI timed out on that ping).
    workers.append(start(settings, celery_client, queue, worker_logs, {}, slots=1))
    job = wait_state(engine, job_id, TERMINAL, 240, workers[-1])
    assert job.state == "succeeded", job.error
    assert job.attempt == 2
    events = job_events(engine, job_id)
    resumed = next(e for e in events if e.state_to == "running" and e.attempt == 2)
    assert resumed.data["start_step"] == stopped_at
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, long_steps + 1))
    print(f"handed back at step {stopped_at}: {handed_back.message}")


def test_cancel_ends_an_assembling_gang_and_a_running_one_with_every_node_s_processes(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    dataset_id: str,
    workers: list[Worker],
) -> None:
    queue = unique_queue("gangcancel")
    workers.append(start(settings, celery_client, queue, worker_logs, {}))
    spec = gang_spec(
        queue,
        dataset_id,
        nodes=2,
        procs=1,
        train={"max_steps": 5000},
        eval={"interval_steps": 1000},
    )

    def published(job_id: int) -> bool:
        return any("gang of 2 nodes" in e.message for e in job_events(engine, job_id))

    def cancel_and_wait(job_id: int) -> float:
        started = time.monotonic()
        with Session(engine) as s:
            jobs.cancel(session=s, job_id=job_id)
            s.commit()
        wait_state(engine, job_id, ("cancelled",), bound(GONE_WITHIN_S), workers[0])
        for launch in launches(job_events(engine, job_id)):
            left = max(0.1, bound(GONE_WITHIN_S) - (time.monotonic() - started))
            wait_for(f"node {launch.data['node_rank']}'s trainer to be gone",
                     lambda pgid=launch.data["pgid"]: group_gone(pgid), left)  # fmt: skip
        took = time.monotonic() - started
        record("gang cancel -> every node's processes gone", took, GONE_WITHIN_S)
        return took

    assembling = submit(engine, celery_client, project, spec)  # one worker: node 0 waits for node 1
    wait_for("node 0 to publish the rendezvous", lambda: published(assembling), 60)
    took_assembling = cancel_and_wait(assembling)
    assert not launches(job_events(engine, assembling))

    workers.append(start(settings, celery_client, queue, worker_logs, {}))
    running = submit(engine, celery_client, project, spec)
    wait_step(engine, running, 5, 180, "the gang")
    took_running = cancel_and_wait(running)
    assert len(launches(job_events(engine, running))) == 2
    assert job_row(engine, running).state == "cancelled"
    print(f"cancelled assembling gang in {took_assembling:.1f} s, running in {took_running:.1f} s")


def test_a_node_s_trainer_crash_restarts_the_whole_gang_at_once(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    dataset_id: str,
    workers: list[Worker],
) -> None:
    queue = unique_queue("gangcrash")
    for _ in range(2):
        workers.append(start(settings, celery_client, queue, worker_logs, {}))
    spec = gang_spec(queue, dataset_id, nodes=2, procs=1, **RESTARTABLE)
    job_id = submit(engine, celery_client, project, spec)
    # One node's trainer crashes (its rank SIGKILLed) after the checkpoint at step 4, while
    # its worker lives on; the other node's rank is only paused for the kill.
    resume_step = kill_ranks_after_checkpoint(
        engine, settings, job_id, step=4, nodes=(1,), timeout_s=180
    )
    assert 4 <= resume_step < STEPS, resume_step
    job = wait_state(engine, job_id, TERMINAL, 240, workers[0])
    assert job.state == "succeeded", f"{job.error}\n{workers[1].log[-3000:]}"
    assert job.attempt == 2
    events = job_events(engine, job_id)
    (restarting,) = [e for e in events if e.state_to == "restarting"]
    # The failing node ended the attempt itself, without waiting for the reaper.
    assert restarting.data["cause"] == "failure" and restarting.data["exit_code"] != 0
    assert restarting.data["failure_class"] == "infra"  # a crash, not a lost node
    assert sorted((e.attempt, e.data["node_rank"]) for e in launches(events)) == [
        (1, 0), (1, 1), (2, 0), (2, 1),
    ]  # fmt: skip
    assert all(group_gone(e.data["pgid"]) for e in launches(events))
    resumed = next(e for e in events if e.state_to == "running" and e.attempt == 2)
    assert resumed.data["start_step"] == resume_step
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, STEPS + 1))
    print(f"restart at step {resume_step}: {restarting.message}")
