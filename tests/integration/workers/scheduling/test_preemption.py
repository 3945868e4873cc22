"""Priority preemption with a real worker of one CPU slot and real torchrun: a running job of
low priority checkpoints and goes back to the queue for a job of higher priority (the
reconciler decides, as Celery beat runs it), which runs to success; the low one then resumes
from its checkpoint, with no restart counted and every step trained once.

The jobs are `STEPS_PY` programs (scheduling does not depend on what trains): the low job's
last step waits for a gate the test opens once the high job has run, so the low job is still
running when the reconciler looks, however fast the host."""

from __future__ import annotations

from pathlib import Path

from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.tables import Job
from core.scheduling import queue_forecast
from tests.conftest import ProjectKey
from tests.integration.workers.archives import open_gate, steps_spec
from tests.integration.workers.helpers import (
    TERMINAL,
    job_events,
    job_row,
    metric_series,
    preemption_beat,
    start_worker,
    submit,
    unique_queue,
    wait_for,
    wait_state,
    wait_step,
)

LOW_STEPS = 12


def test_a_higher_priority_job_preempts_a_lower_one_which_resumes_from_its_checkpoint(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    steps_code: str,
) -> None:
    pool = unique_queue("preempt")
    beat = preemption_beat(settings, engine, celery_client, pool)

    worker = start_worker(
        settings=settings, client=celery_client, queue=pool, log_dir=worker_logs, slots=1
    )
    try:
        low_spec = steps_spec(
            steps_code, pool=pool, steps=LOW_STEPS, checkpoint_every=3, gate="go", priority=0
        )
        low = submit(engine, celery_client, project, low_spec)
        wait_step(engine, low, 4, 120, "the low-priority job")
        assert beat() == []  # nothing waits: nobody is preempted

        high_spec = steps_spec(steps_code, pool=pool, steps=2, priority=50)
        high = submit(engine, celery_client, project, high_spec)
        assert wait_for("the reconciler to preempt", beat, 30) == [low]
        with Session(engine) as s:
            waiting = s.get(Job, high)
            assert waiting is not None
            infos = queue_forecast.queue_infos(session=s, jobs=[waiting], worker_timeout_s=10.0)
        if job_row(engine, low).state == "preempting":  # read before the worker acted on it
            assert infos[high].reason == f"preempting job {low}"

        done = wait_state(engine, high, TERMINAL, 120, worker)
        assert done.state == "succeeded", done.error
        open_gate(settings, low, "go")
        resumed = wait_state(engine, low, TERMINAL, 120, worker)
        assert resumed.state == "succeeded", resumed.error
    finally:
        worker.stop()

    assert resumed.attempt == 2 and resumed.restarts_used == 0
    events = job_events(engine, low)
    states = [(e.state_from, e.state_to) for e in events if e.kind == "state"]
    assert ("running", "preempting") in states and ("preempting", "queued") in states
    assert not any(to in ("restarting", "paused", "failed") for _, to in states)
    (preempting,) = [e for e in events if e.state_to == "preempting"]
    assert preempting.data["for_job"] == high
    (preempted,) = [e for e in events if e.kind == "preempted"]
    step = preempted.data["checkpoint_step"]
    assert preempted.data["for_job"] == high and preempted.attempt == 1
    assert step is not None and step >= 4
    saved = [e.data["step"] for e in events if e.kind == "checkpoint" and e.attempt == 1]
    assert saved[-1] == step  # the stop's own checkpoint
    started = next(e for e in events if e.state_to == "running" and e.attempt == 2)
    assert started.data["start_step"] == step
    # No step lost, none trained twice: the second attempt continues from the checkpoint.
    assert [p.step for p in metric_series(engine, low, "loss")] == list(range(1, LOW_STEPS + 1))

    # The high-priority job ran between the preemption and the low job's second attempt.
    high_events = job_events(engine, high)
    high_claimed = next(e for e in high_events if e.state_to == "starting")
    high_done = next(e for e in high_events if e.state_to == "succeeded")
    assert high_claimed.created_at >= preempting.created_at
    assert started.created_at >= high_done.created_at
