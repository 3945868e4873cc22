"""The reconciler re-sends queued jobs whose message was lost and requeues (or ends) the jobs of
lost workers through the lifecycle (`node_lost`): a silent or restarted worker row, or a silent
attempt heartbeat (the fallback)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from core.attempts import gang
from core.jobs import service as jobs
from core.platform.db import session_factory
from core.platform.settings import Settings
from core.platform.tables import Job, JobNode, JobState, utcnow
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    UNTIL_STOPPED,
    Worker,
    create_job,
    group_gone,
    job_events,
    job_row,
    launches,
    running_launch,
    send,
    submit,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
)
from workers import liveness
from workers.reconcile import Report, Scope, reap, reconcile


@pytest.fixture
def run_reconcile(
    settings: Settings, engine: Engine, celery_client: Celery
) -> Callable[..., Report]:
    """The reconciler over the given pools only (other tests' jobs share the database)."""

    def run(
        *pools: str,
        redispatch_after_s: float = 60.0,
        now: datetime | None = None,
        steady_s: float | None = None,
    ) -> Report:
        return reconcile(
            settings=settings,
            session_factory=session_factory(engine),
            dispatch=lambda job_id, queue: send(celery_client, job_id, queue),
            redispatch_after_s=redispatch_after_s,
            pools=list(pools),
            now=now,
            steady_s=steady_s,
        )

    return run


def _cancel_and_wait(engine: Engine, job_id: int, worker: Worker) -> None:
    with Session(engine) as s:
        jobs.cancel(session=s, job_id=job_id)
        s.commit()
    assert wait_state(engine, job_id, ("cancelled",), 30, worker).state == "cancelled"
    for launch in launches(job_events(engine, job_id)):
        wait_for("the trainer to be gone", lambda p=launch.data["pgid"]: group_gone(p), 5)


def _as_if_running_on_a_dead_worker(
    engine: Engine,
    job_id: int,
    silence_s: float,
    *,
    cancelling: bool = False,
    worker: str = "ghost@gone",
) -> Job:
    """Claimed by `worker` (no process: a row, if any, is the test's) and running, its own
    heartbeat `silence_s` old."""
    with Session(engine, expire_on_commit=False) as s:
        assert jobs.claim(session=s, job_id=job_id, worker=worker) is not None
        jobs.transition(session=s, job_id=job_id, to=JobState.RUNNING)
        if cancelling:
            jobs.cancel(session=s, job_id=job_id)
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(heartbeat_at=utcnow() - timedelta(seconds=silence_s))
        )
        s.commit()
        job = s.get(Job, job_id, populate_existing=True)
        assert job is not None
        return job


def _worker_row(engine: Engine, name: str, *, started_at: datetime, seen_s_ago: float) -> None:
    """Worker `name`'s row as its heartbeat thread writes it, last `seen_s_ago` seconds ago."""
    with Session(engine) as s:
        assert liveness.beat(
            session=s,
            name=name,
            pool="tests",
            started_at=started_at,
            now=utcnow() - timedelta(seconds=seen_s_ago),
        )
        s.commit()


def _end(engine: Engine, *job_ids: int) -> None:
    """Fail jobs no worker will ever end (other tests' reconcilers share the database)."""
    with Session(engine) as s:
        for job_id in job_ids:
            jobs.transition(session=s, job_id=job_id, to=JobState.FAILED, message="test cleanup")
        s.commit()


def _requeue_event(engine: Engine, job_id: int) -> Any:
    (restarting,) = [e for e in job_events(engine, job_id) if e.state_to == "restarting"]
    return restarting


def test_a_queued_job_without_a_message_is_sent_again_and_runs(
    engine: Engine,
    project: ProjectKey,
    dataset_id: str,
    worker: Worker,
    run_reconcile: Callable[..., Report],
) -> None:
    job_id = create_job(
        engine, project, tiny_spec(pool=worker.queue, dataset_id=dataset_id, **UNTIL_STOPPED)
    )
    # Never sent: as if the broker lost the message.
    assert run_reconcile(worker.queue, redispatch_after_s=60).redispatched == []
    assert run_reconcile(worker.queue, redispatch_after_s=0).redispatched == [job_id]
    # Once per period: the job counts as fresh again after a re-send.
    assert run_reconcile(worker.queue, redispatch_after_s=60).redispatched == []

    job = wait_state(engine, job_id, ("starting", "running"), 30, worker)
    assert job.attempt == 1 and job.worker == worker.name
    _cancel_and_wait(engine, job_id, worker)


def test_reaper_fails_or_cancels_jobs_whose_worker_stopped_heartbeating(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset_id: str,
    run_reconcile: Callable[..., Report],
) -> None:
    pool = unique_queue("noworker")
    spec = tiny_spec(pool=pool, dataset_id=dataset_id)
    lost, lost_cancelling, alive = (create_job(engine, project, spec) for _ in range(3))
    silence = 2 * settings.heartbeat_timeout_s
    _as_if_running_on_a_dead_worker(engine, lost, silence)
    _as_if_running_on_a_dead_worker(engine, lost_cancelling, silence, cancelling=True)
    _as_if_running_on_a_dead_worker(engine, alive, settings.heartbeat_timeout_s / 2)

    report = run_reconcile(pool)
    assert (report.failed, report.cancelled, report.requeued) == ([lost], [lost_cancelling], [])

    failed = job_row(engine, lost)
    assert failed.state == "failed" and failed.finished_at is not None
    assert failed.failure is not None and failed.failure["class"] == "node_lost"
    match = re.fullmatch(
        r"worker ghost@gone: no heartbeat of the attempt for (\d+) s", failed.failure["reason"]
    )
    assert match and int(match[1]) >= silence
    assert (failed.error or "").startswith(f"[node_lost] {failed.failure['reason']}")
    (ended,) = [e for e in job_events(engine, lost) if e.state_to == "failed"]
    assert ended.data["failure_class"] == "node_lost"
    assert job_row(engine, lost_cancelling).state == "cancelled"
    assert job_row(engine, alive).state == "running"
    assert run_reconcile(pool) == Report()  # nothing left to do
    _end(engine, alive)


def test_a_job_whose_worker_row_went_silent_is_requeued_as_node_lost_after_the_worker_timeout(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset_id: str,
    run_reconcile: Callable[..., Report],
) -> None:
    """The worker's own row, not the job's 60 s heartbeat: its attempt still looks fresh."""
    pool = unique_queue("silentrow")
    spec = tiny_spec(pool=pool, dataset_id=dataset_id, retries={"max_restarts": 2})
    gone, alive = (create_job(engine, project, spec) for _ in range(2))
    timeout = settings.worker_timeout_s
    for job_id, seen_s_ago in ((gone, timeout + 2), (alive, timeout - 3)):
        name = f"w{job_id}@silentrow"
        claimed = _as_if_running_on_a_dead_worker(engine, job_id, 1.0, worker=name)
        started_at = claimed.started_at - timedelta(seconds=30)  # started before its claim
        _worker_row(engine, name, started_at=started_at, seen_s_ago=seen_s_ago)

    # A reconciler that itself just got the database back judges no silence.
    assert run_reconcile(pool, steady_s=timeout - 1) == Report()
    assert run_reconcile(pool, steady_s=timeout) == Report(requeued=[gone])

    job = job_row(engine, gone)
    assert (job.state, job.restarts_used, job.restarts_by_class) == ("queued", 1, {"node_lost": 1})
    assert job.failure is not None and job.failure["class"] == "node_lost"
    assert re.fullmatch(rf"worker w{gone}@silentrow gone: no worker heartbeat for \d+ s",
                        job.failure["reason"])  # fmt: skip
    restarting = _requeue_event(engine, gone)
    assert restarting.data["failure_class"] == "node_lost"
    assert restarting.data["cause"] == "failure"
    assert restarting.data["reason"] == job.failure["reason"]
    assert job_row(engine, alive).state == "running"
    _end(engine, gone, alive)


def test_a_restarted_worker_s_jobs_are_requeued_at_once_and_only_its_own(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset_id: str,
    run_reconcile: Callable[..., Report],
) -> None:
    """A later incarnation under the job's worker name: no timeout to wait for, and silence
    need not be judged (the restarted worker reaps with `silence=False`)."""
    pool = unique_queue("restarted")
    spec = tiny_spec(pool=pool, dataset_id=dataset_id, retries={"max_restarts": 1})
    mine, other = (create_job(engine, project, spec) for _ in range(2))
    for job_id in (mine, other):
        name = f"w{job_id}@restarted"
        claimed = _as_if_running_on_a_dead_worker(engine, job_id, 1.0, worker=name)
        restarted_at = claimed.started_at + timedelta(seconds=1)
        _worker_row(engine, name, started_at=restarted_at, seen_s_ago=0)

    sent: list[tuple[int, str]] = []
    report = reap(
        settings=settings,
        session_factory=session_factory(engine),
        dispatch=lambda *args: sent.append(args),
        scope=Scope(now=utcnow(), silence=False, worker=f"w{mine}@restarted"),
    )
    assert report == Report(requeued=[mine]) and sent == [(mine, pool)]
    reason = _requeue_event(engine, mine).data["reason"]
    assert re.fullmatch(rf"worker w{mine}@restarted restarted at .* UTC; its trainers died", reason)
    assert job_row(engine, other).state == "running"
    # The periodic reconciler finds the other one the same way, whatever its steadiness.
    assert run_reconcile(pool, steady_s=0) == Report(requeued=[other])
    _end(engine, mine, other)


def test_a_gang_whose_one_node_s_worker_went_silent_is_requeued_as_a_whole(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset_id: str,
    run_reconcile: Callable[..., Report],
) -> None:
    pool = unique_queue("gangrow")
    spec = tiny_spec(
        pool=pool, dataset_id=dataset_id, resources={"nodes": 2}, retries={"max_restarts": 1}
    )
    job_id = create_job(engine, project, spec)
    with Session(engine, expire_on_commit=False) as s:
        job = jobs.claim(session=s, job_id=job_id, worker="n0@gangrow")
        assert job is not None
        s.commit()
        gang.publish(session=s, job=job, worker="n0@gangrow", host="10.0.0.1", port=29997)
        assert gang.join(
            session=s, job_id=job_id, attempt=job.attempt, worker="n1@gangrow", host="10.0.0.2"
        )
    long_ago, silent_s = utcnow() - timedelta(seconds=600), settings.worker_timeout_s + 2
    with Session(engine) as s:  # node 0 ended its part, then its worker (the claimant) left
        s.execute(
            update(JobNode)
            .where(JobNode.job_id == job_id, JobNode.node_rank == 0)
            .values(ended_at=utcnow(), exit_code=0)
        )
        s.commit()
    _worker_row(engine, "n0@gangrow", started_at=long_ago, seen_s_ago=silent_s)
    _worker_row(engine, "n1@gangrow", started_at=long_ago, seen_s_ago=0)
    assert run_reconcile(pool) == Report()  # node 1 answers for the attempt now

    _worker_row(engine, "n1@gangrow", started_at=long_ago, seen_s_ago=silent_s)
    assert run_reconcile(pool) == Report(requeued=[job_id])
    failure = job_row(engine, job_id).failure
    assert failure is not None
    assert (failure["class"], failure["node_rank"], failure["host"]) == ("node_lost", 1, "10.0.0.2")
    assert failure["reason"].startswith("worker n1@gangrow gone: no worker heartbeat for")


def test_reaper_requeues_a_lost_job_that_may_restart_and_a_worker_resumes_it(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset_id: str,
    worker: Worker,
    run_reconcile: Callable[..., Report],
) -> None:
    spec = tiny_spec(
        pool=worker.queue, dataset_id=dataset_id, retries={"max_restarts": 1}, **UNTIL_STOPPED
    )
    job_id = create_job(engine, project, spec)
    _as_if_running_on_a_dead_worker(engine, job_id, 2 * settings.heartbeat_timeout_s)

    assert run_reconcile(worker.queue).requeued == [job_id]
    restarting = _requeue_event(engine, job_id)
    assert restarting.data["cause"] == "failure"
    assert restarting.data["failure_class"] == "node_lost"
    assert "no heartbeat of the attempt for" in restarting.message

    job = wait_state(engine, job_id, ("starting", "running"), 30, worker)
    assert job.attempt == 2 and job.worker == worker.name
    _cancel_and_wait(engine, job_id, worker)


def test_a_live_worker_whose_job_was_reaped_stops_its_trainer(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset_id: str,
    worker: Worker,
    celery_client: Celery,
    run_reconcile: Callable[..., Report],
) -> None:
    """Fencing: after a reap (e.g. a network partition outlasting the heartbeat timeout) the
    attempt is no longer the worker's, and the worker must not train on beside a successor."""
    spec = tiny_spec(pool=worker.queue, dataset_id=dataset_id, **UNTIL_STOPPED)
    job_id = submit(engine, celery_client, project, spec)
    launch = running_launch(engine, job_id, worker, first_metric=False)

    later = utcnow() + timedelta(seconds=2 * settings.heartbeat_timeout_s)
    # The reaper skips a row the worker holds locked at that instant (its next period takes
    # it), so run periods until it reaps, as beat would.
    wait_for(
        "the reaper to fail the silent job",
        lambda: run_reconcile(worker.queue, now=later).failed == [job_id],
        20,
    )
    wait_for("the reaped job's trainer to stop", lambda: group_gone(launch.data["pgid"]), 20)
    wait_for(
        "the worker to give the job up",
        lambda: f"job {job_id}: stopping the trainer (lost)" in worker.log,
        5,
    )
    job = job_row(engine, job_id)
    assert job.state == "failed" and (job.error or "").startswith("[node_lost] worker ")
