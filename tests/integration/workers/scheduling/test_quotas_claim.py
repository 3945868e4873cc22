"""Quotas and fair share inside the claim (core.scheduling.claim), and why a job waits
(core.scheduling.queue_forecast), on a real Postgres."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, text, update
from sqlalchemy.orm import Session

from core.attempts import gang
from core.jobs import service as jobs
from core.platform.db import session_scope
from core.platform.tables import Job, JobNode, JobState, Worker, utcnow
from core.scheduling import claim as scheduling
from core.scheduling import queue_forecast, quotas
from tests.conftest import ProjectKey, make_project
from tests.integration.workers.helpers import tiny_spec, unique_queue

TIMEOUT_S = 60.0


def _submit(engine: Engine, project_id: str, pool: str, priority: int = 0, **res: Any) -> int:
    spec = tiny_spec(
        pool=pool, dataset_id="ds_unused", priority=priority, resources={"procs_per_node": 1, **res}
    )
    with Session(engine, expire_on_commit=False) as s:
        return jobs.create(session=s, project_id=project_id, spec=spec).job.id


def _claim(engine: Engine, pool: str) -> int | None:
    with session_scope(engine) as s:
        job = scheduling.claim_next(session=s, pool=pool, worker="w")
        return None if job is None else job.id


def _quota(engine: Engine, project_id: str, pool: str, **values: Any) -> None:
    with Session(engine) as s:
        quotas.put_quota(session=s, project_id=project_id, pool=pool, values=values)


def _queue(engine: Engine, *ids: int) -> dict[int, queue_forecast.QueueInfo]:
    with Session(engine) as s:
        found = [s.get(Job, i) for i in ids]
        return queue_forecast.queue_infos(
            session=s, jobs=[j for j in found if j is not None], worker_timeout_s=TIMEOUT_S
        )


def _worker(engine: Engine, pool: str, total: int, free: int) -> None:
    now = utcnow()
    with session_scope(engine) as s:
        s.add(
            Worker(
                name=f"w-{pool}", pool=f"{pool},other", host="h", pid=1, started_at=now,
                heartbeat_at=now, slots_total=total, slots_free=free,
            )
        )  # fmt: skip


def _running(engine: Engine, job_id: int, *, ran_s: float, step: int, max_steps: int) -> None:
    """Make a claimed job run on `w-<pool>` for `ran_s` seconds at step `step`."""
    with session_scope(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        started = utcnow() - timedelta(seconds=ran_s)
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(state=JobState.RUNNING, started_at=started, current_step=step,
                    max_steps=max_steps)
        )  # fmt: skip
        s.add(
            JobNode(
                job_id=job_id, attempt=job.attempt, node_rank=0, worker=f"w-{job.pool}",
                joined_at=started, devices=[0],
            )
        )  # fmt: skip


def test_a_project_at_its_slot_quota_waits_with_the_reason_and_an_estimated_start(
    engine: Engine, project: ProjectKey
) -> None:
    pool = unique_queue("quota")
    other = make_project(engine)
    _quota(engine, project.project_id, pool, max_slots=2)
    first, second, third = (_submit(engine, project.project_id, pool) for _ in range(3))
    theirs = _submit(engine, other.project_id, pool, priority=-10)
    assert _claim(engine, pool) == first
    assert _claim(engine, pool) == theirs  # fair share: the project with nothing running first
    assert _claim(engine, pool) == second
    assert _claim(engine, pool) is None  # the third is over the quota: it stays queued
    with Session(engine) as s:
        waiting = s.get(Job, third)
        assert waiting is not None
        assert waiting.state == JobState.QUEUED and waiting.wait_reason == "quota gpus 2/2"
    # Unknown ETAs: the reason, no estimate.
    assert _queue(engine, third)[third] == queue_forecast.QueueInfo(1, "quota gpus 2/2", None)
    # A worker with free devices and a running job of the project with 30 s left: the third
    # starts when that job ends.
    _worker(engine, pool, total=4, free=1)
    _running(engine, first, ran_s=30, step=10, max_steps=20)
    info = _queue(engine, third)[third]
    assert info.position == 1 and info.reason == "quota gpus 2/2"
    assert info.estimated_start_at is not None
    assert utcnow() + timedelta(seconds=20) < info.estimated_start_at
    assert info.estimated_start_at < utcnow() + timedelta(seconds=40)
    # Its project's job ends: the third is claimed.
    with session_scope(engine) as s:
        s.execute(update(Job).where(Job.id == first).values(state=JobState.SUCCEEDED))
    assert _claim(engine, pool) == third
    with Session(engine) as s:
        claimed = s.get(Job, third)
        assert claimed is not None and claimed.wait_reason is None


def test_fair_share_follows_the_weights_then_priority_then_age(engine: Engine) -> None:
    pool = unique_queue("share")
    a, b = make_project(engine), make_project(engine)
    _quota(engine, b.project_id, "*", weight=2)
    a_jobs = [_submit(engine, a.project_id, pool) for _ in range(3)]
    b_jobs = [_submit(engine, b.project_id, pool, priority=p) for p in (0, 5, 0)]
    # Equal shares: priority (b's 5), then age; then fewest running slots per weight.
    expected = [b_jobs[1], a_jobs[0], b_jobs[0], a_jobs[1], b_jobs[2], a_jobs[2]]
    _worker(engine, pool, total=8, free=8)
    view = _queue(engine, *a_jobs, *b_jobs)
    assert sorted(view, key=lambda i: view[i].position or 0) == expected
    assert view[a_jobs[0]].reason == "behind priority 5"
    assert view[b_jobs[1]].reason == "claimable now"
    assert [_claim(engine, pool) for _ in expected] == expected
    assert _claim(engine, pool) is None


def test_running_job_and_budget_quotas_hold_back_the_claim(engine: Engine) -> None:
    pool = unique_queue("budget")
    busy, broke, free = make_project(engine), make_project(engine), make_project(engine)
    _quota(engine, busy.project_id, "*", max_running_jobs=1)
    _quota(engine, broke.project_id, pool, monthly_slot_hours=1.0)
    # broke used 2 slot-hours this month: one node of 2 devices for an hour.
    spent = _submit(engine, broke.project_id, pool)
    with session_scope(engine) as s:
        ended = utcnow()
        s.execute(update(Job).where(Job.id == spent).values(state=JobState.SUCCEEDED, attempt=1))
        s.add(
            JobNode(
                job_id=spent, attempt=1, node_rank=0, worker="gone", devices=[0, 1],
                joined_at=ended - timedelta(hours=1), ended_at=ended,
            )
        )  # fmt: skip
    elsewhere = unique_queue("elsewhere")
    running = _submit(engine, busy.project_id, elsewhere)
    assert _claim(engine, elsewhere) == running  # its one job on every pool together
    held = _submit(engine, busy.project_id, pool, priority=9)
    broke_job = _submit(engine, broke.project_id, pool, priority=9)
    free_job = _submit(engine, free.project_id, pool)
    assert _claim(engine, pool) == free_job
    assert _claim(engine, pool) is None
    view = _queue(engine, held, broke_job)
    assert view[held].reason == "quota running jobs 1/1"
    assert view[broke_job].reason == "budget exhausted"
    with Session(engine) as s:
        usage = quotas.list_quotas(session=s, project_id=broke.project_id)[0]
        assert 1.99 < usage.slot_hours_this_month < 2.01


def test_a_gang_waiting_for_its_nodes_says_so(engine: Engine, project: ProjectKey) -> None:
    pool = unique_queue("gang")
    job_id = _submit(engine, project.project_id, pool, nodes=2)
    with session_scope(engine) as s:
        job = scheduling.claim_next(session=s, pool=pool, worker="w0")
        assert job is not None
        gang.publish(session=s, job=job, worker="w0", host="127.0.0.1", port=29500)
    assert _queue(engine, job_id)[job_id] == queue_forecast.QueueInfo(
        None, "gang assembling 1/2", None
    )


def _lock_waiters(engine: Engine) -> int:
    with engine.connect() as conn:
        query = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return int(conn.execute(text(query)).scalar_one())


def test_concurrent_claimants_never_overrun_a_quota(engine: Engine, project: ProjectKey) -> None:
    """One slot on every pool together; two workers of two pools claim at the same time."""
    pool, other_pool = unique_queue("race"), unique_queue("race-too")
    _quota(engine, project.project_id, "*", max_slots=1)
    first_job = _submit(engine, project.project_id, pool)
    second_job = _submit(engine, project.project_id, other_pool)
    got: dict[str, int | None] = {}

    def second_claimant() -> None:
        got["second"] = _claim(engine, other_pool)

    with Session(engine) as first:
        claimed = scheduling.claim_next(session=first, pool=pool, worker="w1")
        assert claimed is not None and claimed.id == first_job  # not committed yet
        thread = threading.Thread(target=second_claimant)
        thread.start()
        # The second claimant sees no job of the project running yet, picks its job and
        # waits for the project's quota row, which the first holds until it commits.
        deadline = time.monotonic() + 20
        while _lock_waiters(engine) == 0:
            assert time.monotonic() < deadline, "the second claimant never waited for the lock"
            assert thread.is_alive(), got
            time.sleep(0.01)
        first.commit()
    thread.join(timeout=20)
    assert got == {"second": None}  # re-read under the lock: the quota is full
    with Session(engine) as s:
        waiting = s.get(Job, second_job)
        assert waiting is not None and waiting.wait_reason == "quota gpus 1/1"
