"""A real worker with room for two jobs claims only within the project's quota: with one slot
allowed, the project's second job waits (`quota gpus 1/1`) while another project's job runs
beside the first, and starts once the first ends (real Celery threads pool, real torchrun).

The jobs are `STEPS_PY` programs (a quota counts slots, whatever trains in them); the first
job's last step waits for a gate the test opens once the other project's job runs, so the
order the test checks is the claim's choice, not how fast a job ends."""

from __future__ import annotations

from typing import Any

from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.tables import JobNode
from core.scheduling import quotas
from tests.conftest import ProjectKey, make_project
from tests.integration.workers.archives import STEPS_PY, open_gate, steps_spec, store_archive
from tests.integration.workers.helpers import (
    create_job,
    job_row,
    send,
    start_worker,
    unique_queue,
    wait_state,
)


def _held(engine: Engine, job_id: int) -> tuple[Any, Any]:
    with Session(engine) as s:
        return s.execute(
            select(JobNode.joined_at, JobNode.ended_at).where(JobNode.job_id == job_id)
        ).one()


def test_a_worker_claims_only_within_the_projects_slot_quota(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Any,
    project: ProjectKey,
    steps_code: str,
) -> None:
    pool = unique_queue("quota-worker")
    with Session(engine) as s:
        quotas.put_quota(
            session=s, project_id=project.project_id, pool=pool, values={"max_slots": 1}
        )
    other = make_project(engine)
    first = create_job(engine, project, steps_spec(steps_code, pool=pool, steps=4, gate="go"))
    second = create_job(engine, project, steps_spec(steps_code, pool=pool, steps=4))
    their_code = store_archive(engine, settings, other, {"steps.py": STEPS_PY})
    theirs = create_job(engine, other, steps_spec(their_code, pool=pool, steps=4))
    worker = start_worker(
        settings=settings, client=celery_client, queue=pool, log_dir=worker_logs, slots=2
    )
    try:
        for job_id in (first, second, theirs):
            send(celery_client, job_id, pool)
        wait_state(engine, theirs, ("running", "succeeded"), 120, worker)
        open_gate(settings, first, "go")
        for job_id in (first, second, theirs):
            wait_state(engine, job_id, ("succeeded", "failed"), 120, worker)
        assert [job_row(engine, j).state for j in (first, second, theirs)] == ["succeeded"] * 3
    finally:
        worker.stop()
    # The second job of the project started only after its first ended; the other
    # project's job was claimed before the second (fair share: its project held nothing).
    _, first_end = _held(engine, first)
    second_start, _ = _held(engine, second)
    theirs_start, _ = _held(engine, theirs)
    assert second_start >= first_end
    assert theirs_start < second_start
    assert job_row(engine, second).wait_reason is None  # cleared by its claim
