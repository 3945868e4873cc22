"""Multi-node gang scheduling with real Celery workers on this host: each node is a worker
running its own `torchrun --nnodes 2 --nproc-per-node 1`, joined over c10d on loopback."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core import jobs
from core.models import JobNode
from core.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    create_job,
    group_gone,
    job_events,
    job_row,
    launches,
    log_lines,
    metric_series,
    send,
    start_worker,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
)
from trainer.spec import JobSpec

STEPS = 16
ASSEMBLE_TIMEOUT_S = 3.0  # the no-deadlock test: node 0 gives up quickly
CONTROL_QUEUE = "torchyard.control"  # workers/app.py's (importing it builds an app)
HEARTBEAT_TIMEOUT_S = 3.0  # the reaper's silence threshold once a node is lost
GONE_WITHIN_S = 10.0  # a cancel ends the job and every node's processes within this


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    holder: list[Worker] = []
    yield holder
    for w in holder:
        w.stop()


def start(
    settings: Settings, client: Celery, queue: str, logs: Path, env: dict[str, str]
) -> Worker:
    return start_worker(settings=settings, client=client, queue=queue, log_dir=logs, extra_env=env)


def gang_spec(pool: str, dataset_id: str, *, nodes: int, procs: int, **more: Any) -> JobSpec:
    sections: dict[str, Any] = {
        "parallelism": {"strategy": "ddp"},
        "train": {"max_steps": STEPS},
        "eval": {"interval_steps": 8},
        "checkpoint": {"interval_steps": 8},
        "resources": {"nodes": nodes, "procs_per_node": procs, "pool": pool},
        **more,
    }
    return tiny_spec(pool=pool, dataset_id=dataset_id, **sections)


def nodes_of(engine: Engine, job_id: int, attempt: int) -> list[JobNode]:
    with Session(engine, expire_on_commit=False) as s:
        query = (
            select(JobNode)
            .where(JobNode.job_id == job_id, JobNode.attempt == attempt)
            .order_by(JobNode.node_rank)
        )
        return list(s.execute(query).scalars())


def test_a_two_node_gang_trains_ddp_to_the_same_loss_as_one_node_with_two_procs(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    dataset_id: str,
    workers: list[Worker],
) -> None:
    queue = unique_queue("gang")
    for _ in range(2):
        workers.append(
            start_worker(settings=settings, client=celery_client, queue=queue, log_dir=worker_logs)
        )
    job_id = create_job(engine, project, gang_spec(queue, dataset_id, nodes=2, procs=1))
    send(celery_client, job_id, queue)
    job = wait_state(engine, job_id, TERMINAL, 180, workers[0])
    assert job.state == "succeeded", f"{job.error}\n{workers[1].log[-4000:]}"
    assert (job.attempt, job.exit_code, job.current_step) == (1, 0, STEPS)

    # One node task per node, on two different workers; node 0 published the endpoint.
    nodes = nodes_of(engine, job_id, 1)
    assert [n.node_rank for n in nodes] == [0, 1]
    assert {n.worker for n in nodes} == {w.name for w in workers}
    assert nodes[0].host == "127.0.0.1" and nodes[0].port is not None
    assert [n.exit_code for n in nodes] == [0, 0]
    assert sum(1 for n in nodes if n.completed) == 1  # the reporting rank's node
    events = job_events(engine, job_id)
    started = launches(events)
    assert sorted(e.data["node_rank"] for e in started) == [0, 1]
    endpoint = f"127.0.0.1:{nodes[0].port}"
    for launch in started:
        argv = launch.data["argv"]
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--nproc-per-node") + 1] == "1"
        assert argv[argv.index("--rdzv-endpoint") + 1] == endpoint
        assert argv[argv.index("--node-rank") + 1] == str(launch.data["node_rank"])
        assert group_gone(launch.data["pgid"])
    assert [e.state_to for e in events if e.kind == "state"] == [
        "queued", "starting", "running", "succeeded",
    ]  # fmt: skip
    # Both nodes' trainers and launchers logged, each line stored once.
    lines = log_lines(engine, job_id)
    assert {0, 1} <= {x.rank for x in lines} <= {0, 1, -1, -2}  # launchers: -1 - node rank
    keys = [(x.rank, x.stream, x.offset) for x in lines]
    assert len(keys) == len(set(keys))

    reference_id = create_job(engine, project, gang_spec(queue, dataset_id, nodes=1, procs=2))
    send(celery_client, reference_id, queue)
    reference = wait_state(engine, reference_id, TERMINAL, 180, workers[0])
    assert reference.state == "succeeded", reference.error
    for name in ("loss", "eval_loss"):
        points = metric_series(engine, job_id, name)
        expected = metric_series(engine, reference_id, name)
        assert [p.step for p in points] == [p.step for p in expected]
        assert [p.value for p in points] == pytest.approx([p.value for p in expected], rel=1e-5)
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, STEPS + 1))
    print(f"final loss: gang 2x1 {job.latest_metrics['loss']:.6f}, "
          f"1x2 {reference.latest_metrics['loss']:.6f}")  # fmt: skip


def test_a_gang_of_two_with_one_free_worker_does_not_deadlock_and_runs_when_a_second_joins(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    dataset_id: str,
    workers: list[Worker],
) -> None:
    queue = unique_queue("gang1")
    fast = {"TORCHYARD_GANG_ASSEMBLE_TIMEOUT_S": str(ASSEMBLE_TIMEOUT_S)}
    workers.append(start(settings, celery_client, queue, worker_logs, fast))
    job_id = create_job(engine, project, gang_spec(queue, dataset_id, nodes=2, procs=1))
    send(celery_client, job_id, queue)

    def releases() -> int:
        return sum(
            1
            for e in job_events(engine, job_id)
            if e.state_to == "queued" and (e.data or {}).get("cause") == "gang_release"
        )

    # The lone worker claims node 0, waits, releases the gang to the queue, and tries again:
    # it is never stuck holding the job.
    wait_for("the gang to be released twice", lambda: releases() >= 2, 60, poll_s=0.2)
    assert not launches(job_events(engine, job_id))  # no trainer started for half a gang
    assert job_row(engine, job_id).state in ("queued", "starting")

    workers.append(start(settings, celery_client, queue, worker_logs, fast))
    job = wait_state(engine, job_id, TERMINAL, 180, workers[0])
    assert job.state == "succeeded", f"{job.error}\n{workers[1].log[-4000:]}"
    assert job.current_step == STEPS
    # The releases did not use the restart budget (max_restarts is 0) and each failed assembly
    # was a fresh attempt; only the assembled one launched trainers, one per node.
    events = job_events(engine, job_id)
    assert not [e for e in events if e.state_to in ("restarting", "failed")]
    started = launches(events)
    assert {e.attempt for e in started} == {job.attempt}
    assert sorted(e.data["node_rank"] for e in started) == [0, 1]
    nodes = nodes_of(engine, job_id, job.attempt)
    assert {n.worker for n in nodes} == {w.name for w in workers}
    points = metric_series(engine, job_id, "loss")
    assert [p.step for p in points] == list(range(1, STEPS + 1))
    print(f"gang released {releases()} times before the second worker joined; "
          f"ran as attempt {job.attempt}")  # fmt: skip


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
    spec = gang_spec(
        queue,
        dataset_id,
        nodes=2,
        procs=1,
        checkpoint={"interval_steps": 4, "keep_last": 10},
        retries={"max_restarts": 1},
    )
    job_id = create_job(engine, project, spec)
    send(celery_client, job_id, queue)
    wait_for(
        "the gang to pass step 6", lambda: (job_row(engine, job_id).current_step or 0) >= 6, 180
    )
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

    reference_id = create_job(engine, project, gang_spec(queue, dataset_id, nodes=1, procs=2))
    send(celery_client, reference_id, queue)
    reference = wait_state(engine, reference_id, TERMINAL, 180, workers[-2])
    assert reference.state == "succeeded", reference.error
    points = metric_series(engine, job_id, "loss")
    assert [p.step for p in points] == list(range(1, STEPS + 1))  # every step exactly once
    expected = metric_series(engine, reference_id, "loss")
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
    job_id = create_job(engine, project, spec)
    send(celery_client, job_id, queue)
    wait_for(
        "the gang to pass step 10", lambda: (job_row(engine, job_id).current_step or 0) >= 10, 180
    )
    node1 = nodes_of(engine, job_id, 1)[1]
    (leaving,) = [w for w in workers if w.name == node1.worker]
    leaving.stop()  # warm shutdown, as a deploy does: the node's trainer checkpoints
    first = launches(job_events(engine, job_id))
    for launch in first:  # the other node stops too, instead of waiting in torchrun
        wait_for(f"node {launch.data['node_rank']}'s trainer to end",
                 lambda pgid=launch.data["pgid"]: group_gone(pgid), 30)  # fmt: skip
    events = job_events(engine, job_id)
    (handed_back,) = [e for e in events if e.state_to == "restarting"]
    assert handed_back.data["cause"] == "shutdown"  # not a failure: no restart budget used
    stopped_at = max(e.data["step"] for e in events if e.kind == "checkpoint")

    workers.append(start(settings, celery_client, queue, worker_logs, {}))
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
        wait_state(engine, job_id, ("cancelled",), GONE_WITHIN_S, workers[0])
        for launch in launches(job_events(engine, job_id)):
            left = max(0.1, GONE_WITHIN_S - (time.monotonic() - started))
            wait_for(f"node {launch.data['node_rank']}'s trainer to be gone",
                     lambda pgid=launch.data["pgid"]: group_gone(pgid), left)  # fmt: skip
        return time.monotonic() - started

    assembling = create_job(engine, project, spec)  # one worker: node 0 waits for node 1
    send(celery_client, assembling, queue)
    wait_for("node 0 to publish the rendezvous", lambda: published(assembling), 60)
    took_assembling = cancel_and_wait(assembling)
    assert not launches(job_events(engine, assembling))

    workers.append(start(settings, celery_client, queue, worker_logs, {}))
    running = create_job(engine, project, spec)
    send(celery_client, running, queue)
    wait_for("the gang to pass step 5", lambda: (job_row(engine, running).current_step or 0) >= 5,
             180)  # fmt: skip
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
    # Only one worker's trainers crash (after step 6, on attempt 1): one node of the gang.
    workers.append(
        start(settings, celery_client, queue, worker_logs, {"TORCHYARD_FAIL_AT_STEP": "6"})
    )
    workers.append(start(settings, celery_client, queue, worker_logs, {}))
    spec = gang_spec(
        queue,
        dataset_id,
        nodes=2,
        procs=1,
        checkpoint={"interval_steps": 4, "keep_last": 10},
        retries={"max_restarts": 1},
    )
    job_id = create_job(engine, project, spec)
    send(celery_client, job_id, queue)
    job = wait_state(engine, job_id, TERMINAL, 240, workers[0])
    assert job.state == "succeeded", f"{job.error}\n{workers[1].log[-3000:]}"
    assert job.attempt == 2
    events = job_events(engine, job_id)
    (restarting,) = [e for e in events if e.state_to == "restarting"]
    # The failing node ended the attempt itself, without waiting for the reaper.
    assert restarting.data["cause"] == "failure" and restarting.data["exit_code"] != 0
    assert restarting.data["exit_cause"] != "worker_lost"
    assert sorted((e.attempt, e.data["node_rank"]) for e in launches(events)) == [
        (1, 0), (1, 1), (2, 0), (2, 1),
    ]  # fmt: skip
    assert all(group_gone(e.data["pgid"]) for e in launches(events))
    resumed = next(e for e in events if e.state_to == "running" and e.attempt == 2)
    assert resumed.data["start_step"] == 4
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, STEPS + 1))
    print(f"restart: {restarting.message}")
