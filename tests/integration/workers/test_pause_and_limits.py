"""Pause checkpoints and stops a run without using a restart; resume continues from there.
`limits.max_runtime_s` stops a run with a checkpoint and a clear reason."""

from __future__ import annotations

import re

from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    TERMINAL,
    UNTIL_STOPPED,
    Worker,
    group_gone,
    job_events,
    launches,
    metric_series,
    send,
    submit,
    tiny_spec,
    wait_for,
    wait_state,
    wait_step,
)

# Enough steps that the pause lands mid-run: a tiny step takes ~12 ms on an idle host, so 20
# steps ended before a pause asked at step 5 reached the trainer. Checkpoints and evals only at
# the end: the pause's own checkpoint is the only one before it.
STEPS = 300


def test_pause_checkpoints_and_stops_and_resume_finishes_with_every_step_once(
    engine: Engine, celery_client: Celery, project: ProjectKey, dataset_id: str, worker: Worker
) -> None:
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        train={"max_steps": STEPS},
        checkpoint={"interval_steps": STEPS},  # the pause's own checkpoint is the only one
        eval={"interval_steps": STEPS},
    )
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, 5, 120)
    with Session(engine) as s:
        assert jobs.pause(session=s, job_id=job_id).state == "pausing"
        s.commit()
    paused = wait_state(engine, job_id, ("paused",), 30, worker)
    (launch,) = launches(job_events(engine, job_id))
    wait_for("the trainer to be gone", lambda: group_gone(launch.data["pgid"]), 10)
    saved = [e.data["step"] for e in job_events(engine, job_id) if e.kind == "checkpoint"]
    assert len(saved) == 1 and saved[0] == paused.current_step

    with Session(engine) as s:
        assert jobs.resume(session=s, job_id=job_id).state == "queued"
        s.commit()
    send(celery_client, job_id, worker.queue)
    job = wait_state(engine, job_id, TERMINAL, 120, worker)
    assert job.state == "succeeded", job.error  # max_restarts 0: a pause is not a failure
    assert job.attempt == 2

    events = job_events(engine, job_id)
    states = [(e.state_from, e.state_to) for e in events if e.kind == "state"]
    assert ("running", "pausing") in states and ("pausing", "paused") in states
    assert ("paused", "queued") in states and not any(to == "restarting" for _, to in states)
    resumed = next(e for e in events if e.state_to == "running" and e.attempt == 2)
    assert resumed.data["start_step"] == saved[0]
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, STEPS + 1))


def test_max_runtime_stops_the_run_with_a_checkpoint_and_fails_it_with_the_reason(
    engine: Engine, celery_client: Celery, project: ProjectKey, dataset_id: str, worker: Worker
) -> None:
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        **UNTIL_STOPPED,
        limits={"max_runtime_s": 6},
        retries={"max_restarts": 3},  # a limit is not retried
    )
    job_id = submit(engine, celery_client, project, spec)
    job = wait_state(engine, job_id, TERMINAL, 90, worker)
    assert job.state == "failed" and job.attempt == 1
    match = re.fullmatch(r"max_runtime_s exceeded \((\d+) s\)", job.error or "")
    assert match and int(match[1]) >= 6
    assert job.runtime_s >= 6
    events = job_events(engine, job_id)
    assert [e.kind for e in events].count("checkpoint") == 1  # the stop saved one
    failed = events[-1]
    assert failed.state_to == "failed" and failed.data["limit"] == "max_runtime_s"
    assert job.failure is None and job.restarts_used == 0  # a limit: no failure class
