"""A worker runs a job end to end: claim, torchrun, ingest, outcome; and cancels one."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    TERMINAL,
    UNTIL_STOPPED,
    Worker,
    create_job,
    group_gone,
    job_events,
    job_nodes,
    launches,
    log_lines,
    metric_series,
    running_launch,
    send,
    submit,
    tiny_spec,
    wait_for,
    wait_state,
)


def test_ddp_job_succeeds_with_falling_loss_checkpoints_logs_of_both_ranks_and_a_sample(
    engine: Engine, celery_client: Celery, project: ProjectKey, dataset_id: str, worker: Worker
) -> None:
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        train={"max_steps": 30},
        eval={"interval_steps": 10},
        resources={"procs_per_node": 2},
    )
    job_id = submit(engine, celery_client, project, spec)

    job = wait_state(engine, job_id, TERMINAL, 120, worker)
    assert job.state == "succeeded", job.error
    assert (job.attempt, job.exit_code, job.current_step) == (1, 0, 30)
    assert job.worker == worker.name and job.heartbeat_at is not None
    # A single-node job is a gang of one: one node slot, holding the node's exit facts.
    (node,) = job_nodes(engine, job_id)
    assert (node.attempt, node.node_rank, node.worker) == (1, 0, worker.name)
    assert (node.exit_code, node.stop, node.failure) == (0, None, None)
    assert node.ended_at is not None and node.completed and node.completed["steps"] == 30

    losses = metric_series(engine, job_id, "loss")
    assert [p.step for p in losses] == list(range(1, 31))
    first, last = losses[:5], losses[-5:]
    assert sum(p.value for p in last) < sum(p.value for p in first) - 0.5
    assert job.latest_metrics["loss"] == pytest.approx(losses[-1].value)
    assert [p.step for p in metric_series(engine, job_id, "eval_loss")] == [10, 20, 30]
    # The worker sampled both ranks' processes (workers.watchers.sysmetrics) while they trained.
    for rank in (0, 1):
        rss = metric_series(engine, job_id, f"sys/rss_bytes/rank{rank}")
        assert rss and all(p.value > 10 * 1024**2 for p in rss), [(p.step, p.value) for p in rss]
        cpu = metric_series(engine, job_id, f"sys/cpu_percent/rank{rank}")
        assert cpu and max(p.value for p in cpu) > 0, cpu
        assert all(0 <= p.step <= 30 for p in [*rss, *cpu])

    events = job_events(engine, job_id)
    assert [(e.state_from, e.state_to) for e in events if e.kind == "state"] == [
        (None, "queued"),
        ("queued", "starting"),
        ("starting", "running"),
        ("running", "succeeded"),
    ]
    assert [e.data["step"] for e in events if e.kind == "checkpoint"] == [10, 20, 30]
    (sample,) = [e for e in events if e.kind == "sample"]
    assert sample.data["prompt"] == spec.sample.prompt and sample.data["text"]
    (launch,) = launches(events)
    assert group_gone(launch.data["pgid"])

    lines = log_lines(engine, job_id)
    assert {line.rank for line in lines} >= {0, 1}
    assert any("step 30" in line.line for line in lines if line.rank == 0)
    keys = [(x.rank, x.stream, x.offset) for x in lines]
    assert len(keys) == len(set(keys))


def test_cancel_of_a_running_job_ends_its_process_group_within_10_s(
    engine: Engine, celery_client: Celery, project: ProjectKey, dataset_id: str, worker: Worker
) -> None:
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        **UNTIL_STOPPED,
        resources={"procs_per_node": 2},
    )
    job_id = submit(engine, celery_client, project, spec)
    launch = running_launch(engine, job_id, worker)
    pgid = launch.data["pgid"]
    assert not group_gone(pgid)

    with Session(engine) as s:
        jobs.cancel(session=s, job_id=job_id)
        s.commit()
    cancelled_at = time.monotonic()
    job = wait_state(engine, job_id, ("cancelled", "failed", "succeeded"), 10, worker)
    wait_for("the trainer's process group to be gone", lambda: group_gone(pgid), 1.0)
    assert time.monotonic() - cancelled_at < 10
    assert job.state == "cancelled"

    events = job_events(engine, job_id)
    states = [(e.state_from, e.state_to) for e in events if e.kind == "state"]
    assert states[-2:] == [("running", "cancelling"), ("cancelling", "cancelled")]
    # The trainer stopped cleanly on SIGTERM: it said so and its final checkpoint is recorded.
    assert any(e.kind == "info" and e.data.get("trainer_state") == "stopped" for e in events)
    assert [e.kind for e in events].count("checkpoint") == 1


def test_invalid_data_fails_the_job_at_once_and_is_never_retried(
    engine: Engine, celery_client: Celery, project: ProjectKey, worker: Worker, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-corpus"
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id="unused",
        data={"dataset": None, "uri": str(missing)},
        retries={"max_restarts": 3},
    )
    job_id = submit(engine, celery_client, project, spec)

    job = wait_state(engine, job_id, TERMINAL, 60, worker)
    assert (job.state, job.attempt, job.exit_code) == ("failed", 1, 2)
    assert "does not exist" in (job.error or "")
    events = job_events(engine, job_id)
    assert not any(e.state_to == "restarting" for e in events)
    assert any(e.kind == "error" and "does not exist" in e.message for e in events)
    # The trainer's own error event says what failed: a user error, never retried.
    assert job.failure is not None and job.restarts_used == 0
    assert (job.failure["class"], job.failure["exit_code"], job.failure["rank"]) == (
        "user_error",
        2,
        0,
    )
    assert "does not exist" in job.failure["reason"] and job.failure["log_tail"]
    assert events[-1].state_to == "failed" and events[-1].data["failure_class"] == "user_error"
    (node,) = job_nodes(engine, job_id)
    assert (node.exit_code, node.stop, node.failure) == (2, None, job.failure)


def test_unknown_dataset_fails_before_any_trainer_starts(
    engine: Engine, celery_client: Celery, project: ProjectKey, worker: Worker
) -> None:
    spec = tiny_spec(pool=worker.queue, dataset_id="ds_missing", retries={"max_restarts": 3})
    job_id = submit(engine, celery_client, project, spec)

    job = wait_state(engine, job_id, TERMINAL, 30, worker)
    assert (job.state, job.attempt) == ("failed", 1)
    assert "ds_missing" in (job.error or "")
    assert launches(job_events(engine, job_id)) == []
    # The worker logs JSON lines, each carrying the job id of the task in progress.
    records = [json.loads(x) for x in worker.log.splitlines() if x.startswith("{")]
    mine = [r for r in records if r.get("job_id") == job_id]
    assert any("claimed attempt 1" in r["message"] for r in mine), worker.log[-3000:]


def test_an_exception_in_the_trainer_fails_the_job_with_the_class_from_its_error_file(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    worker: Worker,
) -> None:
    """Storage refuses the step-10 checkpoint (a file is in the way): the trainer raises, its
    `@record`ed error file and error event say `infra`, and the worker fails the job so."""
    spec = tiny_spec(pool=worker.queue, dataset_id=dataset_id, retries={"max_restarts": 0})
    job_id = create_job(engine, project, spec)
    checkpoints = Path(job_checkpoint_uri(settings, job_id).removeprefix("file://"))
    checkpoints.mkdir(parents=True)
    (checkpoints / "step_00000010").write_text("not a directory")
    send(celery_client, job_id, worker.queue)

    job = wait_state(engine, job_id, TERMINAL, 90, worker)
    assert (job.state, job.attempt, job.exit_code) == ("failed", 1, 1)
    assert job.failure is not None
    assert (job.failure["class"], job.failure["rank"], job.failure["node_rank"]) == ("infra", 0, 0)
    assert job.failure["reason"].startswith("CheckpointWriteError: checkpoint at step 10")
    assert any("CheckpointWriteError" in line for line in job.failure["log_tail"])
    assert (job.error or "").startswith("[infra] CheckpointWriteError: checkpoint at step 10")
    (node,) = job_nodes(engine, job_id)
    assert node.failure == job.failure
    (error,) = [e for e in job_events(engine, job_id) if e.kind == "error"]
    assert (error.data["failure_class"], error.data["exit_code"]) == ("infra", 1)
