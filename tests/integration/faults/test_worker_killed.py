"""SIGKILL a worker mid-run. Its trainers die with it (parent-death signal, or killed with it);
the reconciler notices the silent worker row within `worker_timeout_s` (10 s) plus a reconcile
period (3 s) and requeues the job through the lifecycle (`node_lost`); another worker resumes
it from the last recorded checkpoint; nothing is lost or counted twice. A worker restarted
under the same name requeues its predecessor's job at once, and it runs again exactly once.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri
from core.platform.tables import Job, JobEvent
from core.platform.tables import Worker as WorkerRow
from jobspec.job import JobSpec
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    group_gone,
    job_events,
    job_row,
    kill_tree,
    launches,
    metric_series,
    run_to_success,
    start_worker,
    submit,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
    wait_step,
)
from tests.support.figures import bound, record
from workers.checkpoints import ASIDE

pytestmark = pytest.mark.long
# workers/app.py's (importing it would build the app from this process's settings).
CONTROL_QUEUE = "torchyard.control"
# The promise: a lost worker's job is back in the queue within this.
REQUEUE_WITHIN_S = 15.0
# Default settings (worker_timeout_s 10 s): its row goes stale, a reconcile notices it.
DETECTED_WITHIN_S = 60.0


@pytest.fixture
def queue() -> str:
    return unique_queue("kill")


def _start(
    fleet: list[Worker],
    settings: Settings,
    client: Celery,
    queue: str,
    log_dir: Path,
    *,
    beat: bool = False,
    name: str | None = None,
) -> Worker:
    w = start_worker(
        settings=settings, client=client, queue=queue, log_dir=log_dir, beat=beat, name=name
    )
    fleet.append(w)
    return w


def _spec(queue: str, dataset_id: str, steps: int) -> JobSpec:
    """`steps` steps, a checkpoint every 5 (10 kept), one restart allowed."""
    return tiny_spec(
        pool=queue,
        dataset_id=dataset_id,
        train={"max_steps": steps},
        checkpoint={"interval_steps": 5, "keep_last": 10},
        retries={"max_restarts": 1},
    )


def _requeue(engine: Engine, job_id: int) -> JobEvent | None:
    return next((e for e in job_events(engine, job_id) if e.state_to == "restarting"), None)


def _first_step_of(engine: Engine, job_id: int, attempt: int) -> float | None:
    """When (unix seconds, the trainer's clock) attempt `attempt` trained its first step."""
    times = [p.time for p in metric_series(engine, job_id, "loss") if p.attempt == attempt]
    return min(times) if times else None


def _since(killed_at: float, when: datetime) -> float:
    return when.timestamp() - killed_at


def _check_node_lost(requeue: JobEvent, done: Job) -> None:
    """The requeue was a `node_lost` failure, counted against that class; `done`: the job once
    the next attempt succeeded, which keeps the failure it recovered from
    (core.attempts.lifecycle_apply)."""
    assert requeue.data["failure_class"] == "node_lost", requeue.data
    assert requeue.data["cause"] == "failure"
    assert (done.restarts_used, done.restarts_by_class) == (1, {"node_lost": 1})
    assert done.failure is not None and done.failure["class"] == "node_lost", done.failure
    assert done.failure["reason"] == requeue.data["reason"]


def _check_every_step_once(engine: Engine, job_id: int, steps: int) -> None:
    points = metric_series(engine, job_id, "loss")
    assert [p.step for p in points] == list(range(1, steps + 1))


def test_a_killed_worker_s_job_resumes_elsewhere_with_every_step_once_and_the_same_loss(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    dataset_id: str,
    queue: str,
    fleet: list[Worker],
) -> None:
    """Only the worker is killed: its trainer gets the parent-death SIGTERM and writes a stop
    checkpoint the database never hears of, which the next attempt sets aside. In the sandbox
    the signal reaches the sandbox's keeper, which passes it on (`workers.isolation.keeper`)."""
    steps = 24
    spec = _spec(queue, dataset_id, steps)
    victim = _start(fleet, settings, celery_client, queue, worker_logs)
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, 7, 120)
    (first_launch,) = launches(job_events(engine, job_id))
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    # Parent-death signal: torchrun and its ranks go with the worker (no orphaned trainer).
    pgid = first_launch.data["pgid"]
    wait_for("the victim's trainer to be gone", lambda: group_gone(pgid), 30)
    assert job_row(engine, job_id).state == "running"  # it had reached step 7; nobody knows yet

    # A rescuer, and the reconciler as deployed (beat in a control worker).
    rescuer = _start(fleet, settings, celery_client, queue, worker_logs)
    _start(fleet, settings, celery_client, CONTROL_QUEUE, worker_logs, beat=True)
    requeue = wait_for(
        "the reconciler to requeue the job",
        lambda: _requeue(engine, job_id),
        DETECTED_WITHIN_S,
        poll_s=0.5,
    )
    job = wait_state(engine, job_id, TERMINAL, 120, rescuer)
    assert job.state == "succeeded", job.error
    assert job.attempt == 2 and job.worker == rescuer.name
    _check_node_lost(requeue, job)
    assert requeue.data["reason"].startswith(f"worker {victim.name} gone: no worker heartbeat")

    events = job_events(engine, job_id)
    assert len([e for e in events if e.state_to == "restarting"]) == 1
    assert len(launches(events)) == 2  # one trainer per attempt, never two at once
    recorded_before = [e.data["step"] for e in events if e.kind == "checkpoint" and e.attempt == 1]
    resumed = next(e for e in events if e.state_to == "running" and e.attempt == 2)
    # From the last checkpoint the database knew of (a later one, written while the trainer
    # died, is set aside: its steps' metrics were never stored).
    assert resumed.data["start_step"] == max(recorded_before)
    # The stop checkpoint the dying trainer wrote (parent-death SIGTERM) is kept, set aside.
    aside = Path(job_checkpoint_uri(settings, job_id)) / ASIDE
    set_aside = sorted(int(p.name[5:13]) for p in aside.glob("step_*.a2"))
    # SIGTERM reaches the trainer after the worker's last event, so at least that one exists.
    assert set_aside, f"no stop checkpoint set aside under {aside}"
    assert all(step > max(recorded_before) for step in set_aside)
    print(f"recorded before the kill: {recorded_before}; set aside: {set_aside}")

    reference = run_to_success(engine, celery_client, project, spec, rescuer, 120)

    _check_every_step_once(engine, job_id, steps)
    for name in ("loss", "lr"):
        points = metric_series(engine, job_id, name)
        expected = metric_series(engine, reference.id, name)
        assert [p.value for p in points] == pytest.approx([p.value for p in expected], rel=1e-5)
    assert job.latest_metrics["loss"] == pytest.approx(reference.latest_metrics["loss"], rel=1e-5)


def test_a_worker_killed_with_its_trainers_is_requeued_within_15_s_and_trains_again_elsewhere(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    dataset_id: str,
    queue: str,
    fleet: list[Worker],
) -> None:
    """The issue's case: the worker's whole process tree SIGKILLed mid-run (a host gone), two
    more workers of the pool and a control worker with beat up and idle, default timeouts.
    Measures kill -> requeue (the `restarting` event) and kill -> first step of the next
    attempt."""
    steps, kill_at = 60, 12
    spec = tiny_spec(
        pool=queue,
        dataset_id=dataset_id,
        train={"max_steps": steps},
        eval={"interval_steps": 30},
        checkpoint={"interval_steps": 5, "keep_last": 20},
        retries={"max_restarts": 1},
    )
    for _ in range(2):
        _start(fleet, settings, celery_client, queue, worker_logs)
    _start(fleet, settings, celery_client, CONTROL_QUEUE, worker_logs, beat=True)
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, kill_at, 120)
    (victim,) = [w for w in fleet if w.name == job_row(engine, job_id).worker]
    killed_at = kill_tree(victim, at_least=2)  # the worker and its one rank
    step_at_kill = job_row(engine, job_id).current_step

    requeue = wait_for(
        "the reconciler to requeue the job",
        lambda: _requeue(engine, job_id),
        DETECTED_WITHIN_S,
        poll_s=0.2,
    )
    requeue_s = _since(killed_at, requeue.created_at)
    first_step = wait_for(
        "the next attempt's first step", lambda: _first_step_of(engine, job_id, 2), 120, 0.2
    )
    training_s = first_step - killed_at
    events = job_events(engine, job_id)
    claimed, running = (
        next(_since(killed_at, e.created_at) for e in events if e.state_to == to and e.attempt == 2)
        for to in ("starting", "running")
    )
    figures = (
        f"killed at step {step_at_kill}: kill -> requeue {requeue_s:.1f} s, kill -> training "
        f"again {training_s:.1f} s (claimed at {claimed:.1f} s, trainer running at "
        f"{running:.1f} s; worker_timeout_s {settings.worker_timeout_s:.0f} s)"
    )
    print(figures)
    record("worker killed -> job requeued", requeue_s, REQUEUE_WITHIN_S)
    assert requeue_s < bound(REQUEUE_WITHIN_S), figures

    (rescuer,) = [w for w in fleet if w.queue == queue and w is not victim]
    job = wait_state(engine, job_id, TERMINAL, 120, rescuer)
    assert job.state == "succeeded", job.error
    assert (job.attempt, job.worker) == (2, rescuer.name)
    _check_node_lost(requeue, job)
    assert requeue.data["reason"].startswith(f"worker {victim.name} gone: no worker heartbeat")
    assert len(launches(job_events(engine, job_id))) == 2
    _check_every_step_once(engine, job_id, steps)


def test_a_restarted_worker_requeues_its_predecessor_s_job_at_once_and_it_runs_once_more(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    dataset_id: str,
    queue: str,
    fleet: list[Worker],
) -> None:
    """No reconciler runs here: only the restarted worker itself can requeue the job, and it
    does not wait for the worker timeout, nor adopt the job (a fresh claim, attempt 2)."""
    steps = 30
    spec = _spec(queue, dataset_id, steps)
    first = _start(fleet, settings, celery_client, queue, worker_logs)
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, 7, 120)
    (first_launch,) = launches(job_events(engine, job_id))
    killed_at = kill_tree(first, at_least=2)  # the worker and its one rank
    assert group_gone(first_launch.data["pgid"])

    restarted_at = time.time()
    again = _start(fleet, settings, celery_client, queue, worker_logs, name=first.name)
    requeue = wait_for(
        "the restarted worker to requeue the job",
        lambda: _requeue(engine, job_id),
        settings.worker_timeout_s,
        poll_s=0.2,
    )
    with Session(engine) as s:  # the new incarnation: Celery's start, before it consumed
        incarnation = s.get(WorkerRow, first.name)
        assert incarnation is not None
        started_at = incarnation.started_at
    since_start_s = (requeue.created_at - started_at).total_seconds()
    figures = (
        f"kill -> requeue {_since(killed_at, requeue.created_at):.1f} s; restart -> requeue "
        f"{requeue.created_at.timestamp() - restarted_at:.1f} s (interpreter start included), "
        f"of which {since_start_s:.1f} s from the worker's start"
    )
    print(figures)
    assert 0 < since_start_s < settings.worker_timeout_s, figures
    assert requeue.data["reason"].startswith(f"worker {first.name} restarted at"), figures

    job = wait_state(engine, job_id, TERMINAL, 120, again)
    assert job.state == "succeeded", job.error
    assert (job.attempt, job.worker) == (2, first.name)
    _check_node_lost(requeue, job)
    events = job_events(engine, job_id)
    assert len([e for e in events if e.state_to == "restarting"]) == 1
    assert [e.attempt for e in launches(events)] == [1, 2]  # one new attempt, one trainer
    _check_every_step_once(engine, job_id, steps)
