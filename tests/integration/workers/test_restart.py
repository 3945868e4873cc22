"""A trainer that dies mid-run is restarted and resumes from its checkpoint, as if never stopped:
by the platform (a new attempt through the queue) or by torchrun in place (same attempt)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from core.settings import Settings
from core.storage import job_run_dir
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    Worker,
    create_job,
    job_events,
    job_nodes,
    launches,
    log_lines,
    metric_series,
    send,
    start_worker,
    tiny_spec,
    unique_queue,
    wait_state,
)
from workers.ingest import RESTART_OFFSET_STRIDE
from workers.launcher import RunPaths

# The first attempt dies right after step 15; the last checkpoint is at step 10, so steps
# 11-15 run, and are reported, twice: the stored series must still hold each step once.
FAIL_AT_STEP = 15
TERMINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def faulty_worker(settings: Settings, celery_client: Celery, worker_logs: Path) -> Iterator[Worker]:
    """A worker whose trainers crash (exit 1) after step FAIL_AT_STEP of their first attempt."""
    w = start_worker(
        settings=settings,
        client=celery_client,
        queue=unique_queue("faulty"),
        log_dir=worker_logs,
        extra_env={"TORCHYARD_FAIL_AT_STEP": str(FAIL_AT_STEP)},
    )
    yield w
    w.stop()


@pytest.fixture(scope="module")
def healthy_worker(
    settings: Settings, celery_client: Celery, worker_logs: Path
) -> Iterator[Worker]:
    w = start_worker(
        settings=settings, client=celery_client, queue=unique_queue("healthy"), log_dir=worker_logs
    )
    yield w
    w.stop()


def test_crashed_attempt_restarts_from_checkpoint_and_matches_an_uninterrupted_run(
    engine: Engine,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    faulty_worker: Worker,
    healthy_worker: Worker,
) -> None:
    def submit(worker: Worker) -> int:
        spec = tiny_spec(pool=worker.queue, dataset_id=dataset_id, retries={"max_restarts": 1})
        job_id = create_job(engine, project, spec)
        send(celery_client, job_id, worker.queue)
        return job_id

    crashing, reference = submit(faulty_worker), submit(healthy_worker)
    ref = wait_state(engine, reference, TERMINAL, 120, healthy_worker)
    job = wait_state(engine, crashing, TERMINAL, 120, faulty_worker)
    assert ref.state == "succeeded", ref.error
    assert job.state == "succeeded", job.error
    assert (job.attempt, job.exit_code) == (2, 0)

    events = job_events(engine, crashing)
    assert [(e.attempt, e.state_from, e.state_to) for e in events if e.kind == "state"] == [
        (0, None, "queued"),
        (1, "queued", "starting"),
        (1, "starting", "running"),
        (1, "running", "restarting"),
        (1, "restarting", "queued"),
        (2, "queued", "starting"),
        (2, "starting", "running"),
        (2, "running", "succeeded"),
    ]
    restarting = next(e for e in events if e.state_to == "restarting")
    # The rank exits 1 without an exception (no error event, no error file): `infra`,
    # retried while max_restarts lasts.
    assert restarting.data == {
        "cause": "failure",
        "attempt": 1,
        "exit_code": 1,
        "failure_class": "infra",
        "reason": "a rank exited without recording an exception (a signal or a hard exit); "
        "torchrun exited 1",
    }
    assert restarting.message.startswith("attempt 1 failed (infra): a rank exited without")
    assert (job.restarts_used, job.restarts_by_class) == (1, {"infra": 1})
    first, second = job_nodes(engine, crashing)  # one node slot per attempt
    assert (first.attempt, first.exit_code, second.attempt, second.exit_code) == (1, 1, 2, 0)
    assert first.failure is not None and first.failure["class"] == "infra"
    assert second.failure is None and job.failure is None  # success clears the job's failure
    assert len(launches(events)) == 2
    resumed = [e for e in events if e.state_to == "running"][-1]
    assert resumed.data["start_step"] == 10
    assert [e.data["step"] for e in events if e.kind == "checkpoint"] == [10, 20, 24]

    losses = metric_series(engine, crashing, "loss")
    reference_losses = metric_series(engine, reference, "loss")
    assert [p.step for p in losses] == list(range(1, 25))
    assert [p.value for p in losses] == pytest.approx([p.value for p in reference_losses], rel=1e-5)
    assert {p.attempt for p in losses if p.step <= 10} == {1}
    assert {p.attempt for p in losses if p.step > 10} == {2}


def test_ranks_restarted_in_place_resume_from_checkpoint_within_the_same_attempt(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    faulty_worker: Worker,
    healthy_worker: Worker,
) -> None:
    """Both ranks exit 1 after step 15 of torchrun's first run of the worker group; with
    `max_inplace_restarts: 1` torchrun restarts them (restart 1), they resume from step 10."""

    def submit(worker: Worker) -> int:
        spec = tiny_spec(
            pool=worker.queue,
            dataset_id=dataset_id,
            resources={"procs_per_node": 2},
            retries={"max_restarts": 0, "max_inplace_restarts": 1},
        )
        job_id = create_job(engine, project, spec)
        send(celery_client, job_id, worker.queue)
        return job_id

    crashing, reference = submit(faulty_worker), submit(healthy_worker)
    ref = wait_state(engine, reference, TERMINAL, 180, healthy_worker)
    job = wait_state(engine, crashing, TERMINAL, 180, faulty_worker)
    assert ref.state == "succeeded", ref.error
    assert job.state == "succeeded", job.error
    assert (job.attempt, job.exit_code) == (1, 0)  # no new attempt through the queue

    events = job_events(engine, crashing)
    assert [(e.attempt, e.state_from, e.state_to) for e in events if e.kind == "state"] == [
        (0, None, "queued"),
        (1, "queued", "starting"),
        (1, "starting", "running"),
        (1, "running", "succeeded"),
    ]
    assert len(launches(events)) == 1
    running = next(e for e in events if e.state_to == "running")
    assert (running.data["restart"], running.data["start_step"]) == (0, 0)
    (restarted,) = [e for e in events if (e.message or "").startswith("ranks restarted in place")]
    assert restarted.message.startswith("ranks restarted in place (restart 1); ")
    assert (restarted.attempt, restarted.data["restart"]) == (1, 1)
    assert restarted.data["start_step"] == 10
    assert [e.data["step"] for e in events if e.kind == "checkpoint"] == [10, 20, 24]

    losses = metric_series(engine, crashing, "loss")
    reference_losses = metric_series(engine, reference, "loss")
    assert [p.step for p in losses] == list(range(1, 25))
    assert [p.value for p in losses] == pytest.approx([p.value for p in reference_losses], rel=1e-5)
    assert {p.attempt for p in losses} == {1}

    # Every line of both runs of the worker group is stored once, in its file's order.
    files = RunPaths(run_dir=job_run_dir(settings, crashing, 1), checkpoint_dir="", data="")
    rank_files = files.rank_logs()
    assert {(restart, rank) for restart, rank, _ in rank_files} == {
        (0, 0), (0, 1), (1, 0), (1, 1)
    }  # fmt: skip
    stored = log_lines(engine, crashing)
    for (restart, rank, stream), path in rank_files.items():
        low, high = restart * RESTART_OFFSET_STRIDE, (restart + 1) * RESTART_OFFSET_STRIDE
        mine = sorted(
            (x.offset, x.line)
            for x in stored
            if (x.rank, x.stream) == (rank, stream) and low <= x.offset < high
        )
        assert [line for _, line in mine] == path.read_text().splitlines(), (restart, rank, stream)
    first_run = "\n".join(
        x.line for x in stored if x.rank == 0 and x.offset < RESTART_OFFSET_STRIDE
    )
    assert f"TORCHYARD_FAIL_AT_STEP={FAIL_AT_STEP}: exiting with code 1" in first_run
