"""Multi-node gang scheduling with real Celery workers on this host: each node is a worker
running its own `torchrun --nnodes 2 --nproc-per-node 1`, joined over c10d on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.tables import JobNode
from jobspec.job import JobSpec
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    group_gone,
    job_events,
    job_row,
    launches,
    log_lines,
    metric_series,
    start_worker,
    submit,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
)

STEPS = 16
ASSEMBLE_TIMEOUT_S = 3.0  # the no-deadlock test: node 0 gives up quickly


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    holder: list[Worker] = []
    yield holder
    for w in holder:
        w.stop()


def start(
    settings: Settings,
    client: Celery,
    queue: str,
    logs: Path,
    env: dict[str, str],
    slots: int | None = None,
) -> Worker:
    """A worker on `queue` (`start_worker`); `slots`: on the threads pool, as production runs."""
    return start_worker(
        settings=settings, client=client, queue=queue, log_dir=logs, extra_env=env, slots=slots
    )


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


@pytest.mark.long  # ~2 min
def test_a_two_node_gang_on_loopback_runs_one_node_task_per_worker_and_stores_each_line_once(
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
    job_id = submit(engine, celery_client, project, gang_spec(queue, dataset_id, nodes=2, procs=1))
    job = wait_state(engine, job_id, TERMINAL, 300, workers[0])  # a bound for a loaded CI host
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
        # The node's end is recorded once torchrun exits; its orphaned children are reaped
        # by init a moment later, which a loaded host can stretch.
        wait_for("node's process group to be gone", lambda p=launch.data["pgid"]: group_gone(p), 30)
    assert [e.state_to for e in events if e.kind == "state"] == [
        "queued", "starting", "running", "succeeded",
    ]  # fmt: skip
    # Both nodes' trainers and launchers logged, each line stored once.
    lines = log_lines(engine, job_id)
    assert {0, 1} <= {x.rank for x in lines} <= {0, 1, -1, -2}  # launchers: -1 - node rank
    keys = [(x.rank, x.stream, x.offset) for x in lines]
    assert len(keys) == len(set(keys))
    # Each node's worker sampled its own rank (global RANK) and its whole tree (sysmetrics).
    for who in ("rank0", "rank1", "node0", "node1"):
        rss = metric_series(engine, job_id, f"sys/rss_bytes/{who}")
        assert rss and all(p.value > 0 for p in rss), who

    # Its losses equal 1 node x 2 procs': tests/integration/hosts/test_gang_hosts.py checks it
    # across two hosts (network namespaces), which this loopback run only stands in for.
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, STEPS + 1))


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
    job_id = submit(engine, celery_client, project, gang_spec(queue, dataset_id, nodes=2, procs=1))

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

    # On the threads pool: the released gang's messages are already queued, and a solo pool
    # that joins the gang first answers no ping until the job ends (the last fresh-clone CI
    # timed out on that ping, the worker having joined as node 1 the second it was ready).
    workers.append(start(settings, celery_client, queue, worker_logs, fast, slots=1))
    job = wait_state(engine, job_id, TERMINAL, 300, workers[0])  # a bound for a loaded CI host
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
