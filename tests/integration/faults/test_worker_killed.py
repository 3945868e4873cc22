"""SIGKILL a worker mid-run: its trainer dies with it, the reaper requeues the job and another
worker resumes it from the last recorded checkpoint; nothing is lost or counted twice."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from core.settings import Settings
from core.storage import job_checkpoint_uri
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    Worker,
    create_job,
    group_gone,
    job_events,
    job_row,
    launches,
    metric_series,
    send,
    start_worker,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
)
from workers.checkpoints import ASIDE

pytestmark = pytest.mark.long  # waits for the reaper: ~2 min
STEPS = 24
# workers/app.py's (importing it would build the app from this process's settings).
CONTROL_QUEUE = "torchyard.control"
RECONCILE_INTERVAL_S = 20.0
# The reaper's silence threshold in this test (workers heartbeat every second).
HEARTBEAT_TIMEOUT_S = 3.0


@pytest.fixture
def queue() -> str:
    return unique_queue("kill")


@pytest.fixture
def rescuer() -> Iterator[list[Worker]]:
    """The workers the test starts once the victim is gone (the first serves its pool)."""
    holder: list[Worker] = []
    yield holder
    for w in holder:
        w.stop()


def test_a_killed_worker_s_job_resumes_elsewhere_with_every_step_once_and_the_same_loss(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    dataset_id: str,
    queue: str,
    rescuer: list[Worker],
) -> None:
    spec = tiny_spec(
        pool=queue,
        dataset_id=dataset_id,
        train={"max_steps": STEPS},
        checkpoint={"interval_steps": 5, "keep_last": 10},
        retries={"max_restarts": 1},
    )
    victim = start_worker(settings=settings, client=celery_client, queue=queue, log_dir=worker_logs)
    try:
        job_id = create_job(engine, project, spec)
        send(celery_client, job_id, queue)
        wait_for(
            "the run to pass step 7",
            lambda: (job_row(engine, job_id).current_step or 0) >= 7,
            120,
        )
        (first_launch,) = launches(job_events(engine, job_id))
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
    finally:
        victim.stop(5)
    # Parent-death signal: torchrun and its ranks go with the worker (no orphaned trainer).
    pgid = first_launch.data["pgid"]
    wait_for("the victim's trainer to be gone", lambda: group_gone(pgid), 30)
    assert job_row(engine, job_id).state in ("starting", "running")  # nobody knows yet

    # The reaper as deployed: Celery beat in a control worker sends workers.reconcile every
    # 20 s; any idle worker may run it, so both get the short heartbeat timeout.
    fast = {"TORCHYARD_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S)}
    for queue_name, beat in ((queue, False), (CONTROL_QUEUE, True)):
        rescuer.append(
            start_worker(
                settings=settings,
                client=celery_client,
                queue=queue_name,
                log_dir=worker_logs,
                extra_env=fast,
                beat=beat,
            )
        )

    def requeued() -> bool:
        return any(e.state_to == "restarting" for e in job_events(engine, job_id))

    wait_for("the reaper to requeue the job", requeued, RECONCILE_INTERVAL_S * 3, poll_s=0.5)
    job = wait_state(engine, job_id, ("succeeded", "failed", "cancelled"), 120, rescuer[0])
    assert job.state == "succeeded", job.error
    assert job.attempt == 2 and job.worker == rescuer[0].name

    events = job_events(engine, job_id)
    restarting = [e for e in events if e.state_to == "restarting"]
    assert len(restarting) == 1
    assert restarting[0].data["exit_cause"] == "worker_lost"
    assert restarting[0].message.startswith("worker lost (no heartbeat for")
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

    reference_id = create_job(engine, project, spec)
    send(celery_client, reference_id, queue)
    reference = wait_state(engine, reference_id, ("succeeded", "failed"), 120, rescuer[0])
    assert reference.state == "succeeded", reference.error

    for name in ("loss", "lr"):
        points = metric_series(engine, job_id, name)
        expected = metric_series(engine, reference_id, name)
        assert [p.step for p in points] == list(range(1, STEPS + 1))  # every step exactly once
        assert [p.value for p in points] == pytest.approx([p.value for p in expected], rel=1e-5)
    assert job.latest_metrics["loss"] == pytest.approx(reference.latest_metrics["loss"], rel=1e-5)
