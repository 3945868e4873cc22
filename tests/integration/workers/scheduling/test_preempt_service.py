"""Priority preemption's service (core.scheduling.preemption_apply) on a real Postgres: which pools
it looks at, the victim it marks, the queue reason of the job it is for, the requeue at the
attempt's end, and a pause or cancel that overrides it. The run with a real worker and torchrun is
test_preemption.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from core.attempts import lifecycle_apply as attempts
from core.attempts.lifecycle_policy import NodeEnd, Stop, decide
from core.jobs import service as jobs
from core.platform.db import session_scope
from core.platform.settings import Settings
from core.platform.tables import Job, JobEvent, JobNode, JobState, WebhookEvent, Worker, utcnow
from core.scheduling import preemption_apply as preempt
from core.scheduling import queue_forecast, quotas
from core.webhooks import subscriptions as webhooks
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import tiny_spec, unique_queue


def _submit(engine: Engine, project: ProjectKey, pool: str, priority: int) -> int:
    spec = tiny_spec(pool=pool, dataset_id="ds_unused", priority=priority)
    with Session(engine, expire_on_commit=False) as s:
        return jobs.create(session=s, project_id=project.project_id, spec=spec).job.id


def _worker(engine: Engine, pool: str, total: int = 1) -> str:
    now, name = utcnow(), f"w-{pool}"
    with session_scope(engine) as s:
        s.add(
            Worker(
                name=name, pool=pool, host="h", pid=1, started_at=now, heartbeat_at=now,
                slots_total=total, slots_free=0,
            )
        )  # fmt: skip
    return name


def _run(engine: Engine, job_id: int, worker: str, ran_s: float, step: int | None = 10) -> None:
    """Claim the job on `worker` and make it run for `ran_s` seconds, at `step` of 24."""
    with session_scope(engine) as s:
        job = jobs.claim(session=s, job_id=job_id, worker=worker)
        assert job is not None
        started = utcnow() - timedelta(seconds=ran_s)
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(state=JobState.RUNNING, started_at=started, current_step=step, max_steps=24)
        )
        s.add(
            JobNode(
                job_id=job_id, attempt=job.attempt, node_rank=0, worker=worker,
                joined_at=started, devices=[0],
            )
        )  # fmt: skip


def _enabled(settings: Settings, pool: str, **more: Any) -> Settings:
    return settings.model_copy(
        update={"preemption_pools": [pool], "preemption_min_run_s": 60.0, **more}
    )


def _preempt(engine: Engine, settings: Settings, pool: str) -> dict[int, int]:
    with session_scope(engine) as s:
        return preempt.preempt_pool(session=s, pool=pool, settings=settings)


def _state(engine: Engine, job_id: int) -> str:
    with Session(engine) as s:
        return str(s.execute(select(Job.state).where(Job.id == job_id)).scalar_one())


def _end_attempt(engine: Engine, job_id: int, stop: Stop | None = Stop.PREEMPT) -> None:
    """The worker's end of the attempt: its trainer stopped (with `stop`), exit 0."""
    with session_scope(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        decision = decide(attempts.facts_for(job, ended=[NodeEnd(0, exit_code=0, stop=stop)]))
        attempts.apply(session=s, job=job, decision=decision, runtime_s=5.0, exit_code=0)


def test_the_lowest_priority_running_job_yields_and_is_requeued_without_a_restart(
    engine: Engine, settings: Settings, project: ProjectKey
) -> None:
    pool = unique_queue("preempt-svc")
    worker = _worker(engine, pool)
    low = _submit(engine, project, pool, priority=0)
    _run(engine, low, worker, ran_s=300, step=None)  # no step yet: no ETA of its own
    high = _submit(engine, project, pool, priority=50)
    enabled = _enabled(settings, pool)
    with session_scope(engine) as s:
        webhooks.create(
            session=s,
            project_id=project.project_id,
            url="http://127.0.0.1:9/hook",
            event_types=["job.preempting", "job.preempted"],
            allow=["127.0.0.1/32"],
        )
    with Session(engine) as s:
        assert pool not in preempt.candidate_pools(session=s, settings=settings)  # default off
        assert pool in preempt.candidate_pools(session=s, settings=enabled)

    assert _preempt(engine, enabled, pool) == {low: high}
    assert _state(engine, low) == "preempting"
    assert _preempt(engine, enabled, pool) == {}  # its devices are on their way: no second
    with Session(engine) as s:
        waiting = s.get(Job, high)
        assert waiting is not None
        info = queue_forecast.queue_infos(session=s, jobs=[waiting], worker_timeout_s=60.0)[high]
    assert info.reason == f"preempting job {low}"
    assert info.estimated_start_at is not None  # a preempting job frees its devices soon

    _end_attempt(engine, low)
    with Session(engine) as s:
        job = s.get(Job, low)
        assert job is not None
        assert (job.state, job.restarts_used, job.attempt) == ("queued", 0, 1)
        events = list(s.scalars(select(JobEvent).where(JobEvent.job_id == low)))
    (preempted,) = [e for e in events if e.kind == "preempted"]
    assert preempted.data["for_job"] == high and preempted.data["for_priority"] == 50
    assert f"yielded to job {high}" in preempted.message
    requeued = [e for e in events if e.state_from == "preempting"]
    assert [e.state_to for e in requeued] == ["queued"]
    assert requeued[0].data["cause"] == "preempted"
    with Session(engine) as s:
        sent = s.execute(
            select(WebhookEvent.type, WebhookEvent.payload)
            .where(WebhookEvent.project_id == project.project_id)
            .order_by(WebhookEvent.id)
        ).all()
    assert [(t, p["job"]["id"]) for t, p in sent] == [
        ("job.preempting", low),
        ("job.preempted", low),
    ]
    assert sent[1].payload["data"]["for_job"] == high


@pytest.mark.parametrize(
    ("limit", "reason"),
    [({"max_slots": 1}, "quota gpus 1/1"), ({"max_running_jobs": 1}, "quota running jobs 1/1")],
    ids=["slots", "running-jobs"],
)
def test_a_job_its_projects_quota_keeps_out_preempts_only_its_projects_own_job(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    other_project: ProjectKey,
    limit: dict[str, int],
    reason: str,
) -> None:
    """A free device is no use to a job whose project is at its slot or running-jobs limit:
    the project's own job of lower priority yields to it; another project's, of lower priority
    still, runs on."""
    pool = unique_queue("preempt-quota")
    worker = _worker(engine, pool, total=3)
    with Session(engine) as s:
        quotas.put_quota(session=s, project_id=project.project_id, pool=pool, values=limit)
    theirs = _submit(engine, other_project, pool, priority=0)
    mine = _submit(engine, project, pool, priority=10)
    for job_id in (theirs, mine):
        _run(engine, job_id, worker, ran_s=300)
    urgent = _submit(engine, project, pool, priority=50)
    with Session(engine) as s:
        waiting = s.get(Job, urgent)
        assert waiting is not None
        info = queue_forecast.queue_infos(session=s, jobs=[waiting], worker_timeout_s=60.0)[urgent]
    assert info.reason == reason

    assert _preempt(engine, _enabled(settings, pool), pool) == {mine: urgent}
    assert _preempt(engine, _enabled(settings, pool), pool) == {}  # its quota is on its way back
    assert (_state(engine, mine), _state(engine, theirs)) == ("preempting", "running")


def test_no_preemption_for_equal_priority_a_young_job_or_a_pool_that_is_not_enabled(
    engine: Engine, settings: Settings, project: ProjectKey
) -> None:
    pool = unique_queue("preempt-none")
    worker = _worker(engine, pool)
    running = _submit(engine, project, pool, priority=10)
    _run(engine, running, worker, ran_s=30)
    _submit(engine, project, pool, priority=10)
    assert _preempt(engine, _enabled(settings, pool), pool) == {}  # equal priority
    urgent = _submit(engine, project, pool, priority=90)
    assert _preempt(engine, _enabled(settings, pool), pool) == {}  # ran 30 s of 60
    with Session(engine) as s:
        assert pool not in preempt.candidate_pools(
            session=s, settings=_enabled(settings, "another-pool")
        )
    assert _preempt(engine, _enabled(settings, pool, preemption_min_run_s=10.0), pool) == {
        running: urgent
    }


def test_a_pause_or_a_cancel_overrides_a_preemption(
    engine: Engine, settings: Settings, project: ProjectKey
) -> None:
    pool = unique_queue("preempt-override")
    worker = _worker(engine, pool, total=2)
    paused, cancelled = (_submit(engine, project, pool, priority=0) for _ in range(2))
    for job_id in (paused, cancelled):
        _run(engine, job_id, worker, ran_s=300)
    _submit(engine, project, pool, priority=50)
    _submit(engine, project, pool, priority=50)
    assert set(_preempt(engine, _enabled(settings, pool), pool)) == {paused, cancelled}

    with session_scope(engine) as s:
        assert jobs.pause(session=s, job_id=paused).state == "pausing"
        assert jobs.cancel(session=s, job_id=cancelled).state == "cancelling"
    _end_attempt(engine, paused, Stop.PAUSE)
    _end_attempt(engine, cancelled, Stop.CANCEL)
    assert (_state(engine, paused), _state(engine, cancelled)) == ("paused", "cancelled")
