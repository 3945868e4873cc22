"""An attempt that could not be prepared (`workers.attempt.fail_unlaunched`): a retryable
failure (storage unreachable while preparing) goes through the retry policy, a plain one fails
the job, and a stop asked for meanwhile wins over both. Real Postgres; no trainer."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.attempts.lifecycle_policy import FailureClass, Outcome
from core.jobs import service as jobs
from core.platform.tables import Job
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import create_job, job_events, tiny_spec, unique_queue
from workers.attempt import Unlaunched, fail_unlaunched

STORAGE_DOWN = "preparing the attempt failed: EndpointConnectionError: Could not connect"


def _claimed(engine: Engine, project: ProjectKey, dataset_id: str, max_restarts: int) -> Job:
    spec = tiny_spec(pool=unique_queue("unlaunched"), dataset_id=dataset_id,
                     retries={"max_restarts": max_restarts})  # fmt: skip
    job_id = create_job(engine, project, spec)
    with Session(engine, expire_on_commit=False) as s:
        job = jobs.claim(session=s, job_id=job_id, worker="in-process")
        s.commit()
    assert job is not None
    return job


def _end(engine: Engine, job: Job, exc: Exception) -> tuple[str, Job]:
    with Session(engine, expire_on_commit=False) as s:
        outcome = fail_unlaunched(s, job, exc)
        row = s.get(Job, job.id, populate_existing=True)
    assert row is not None
    return outcome, row


def test_a_retryable_failure_while_preparing_requeues_the_job_within_its_budget(
    engine: Engine, project: ProjectKey, dataset_id: str
) -> None:
    job = _claimed(engine, project, dataset_id, max_restarts=1)
    outcome, row = _end(engine, job, Unlaunched(STORAGE_DOWN, FailureClass.INFRA, retryable=True))
    assert outcome == Outcome.RESTART
    assert (row.state, row.restarts_used, row.restarts_by_class) == ("queued", 1, {"infra": 1})
    (restarting,) = [e for e in job_events(engine, job.id) if e.state_to == "restarting"]
    assert restarting.data["failure_class"] == "infra"
    assert STORAGE_DOWN in restarting.data["reason"]

    again = _claimed_again(engine, row)
    outcome, row = _end(engine, again, Unlaunched(STORAGE_DOWN, FailureClass.INFRA, retryable=True))
    assert outcome == Outcome.FAILED  # the budget is spent
    assert row.state == "failed" and row.failure is not None
    assert row.failure["class"] == "infra"


def _claimed_again(engine: Engine, job: Job) -> Job:
    with Session(engine, expire_on_commit=False) as s:
        claimed = jobs.claim(session=s, job_id=job.id, worker="in-process")
        s.commit()
    assert claimed is not None and claimed.attempt == 2
    return claimed


@pytest.mark.parametrize("retryable", [False, True])
def test_a_cancel_asked_for_while_preparing_wins_over_the_failure(
    engine: Engine, project: ProjectKey, dataset_id: str, retryable: bool
) -> None:
    job = _claimed(engine, project, dataset_id, max_restarts=1)
    with Session(engine) as s:
        jobs.cancel(session=s, job_id=job.id, project_id=project.project_id)
        s.commit()
    outcome, row = _end(
        engine, job, Unlaunched(STORAGE_DOWN, FailureClass.INFRA, retryable=retryable)
    )
    assert outcome == Outcome.CANCELLED and row.state == "cancelled"


def test_a_plain_unlaunched_failure_fails_the_job_whatever_its_budget(
    engine: Engine, project: ProjectKey, dataset_id: str
) -> None:
    job = _claimed(engine, project, dataset_id, max_restarts=3)
    outcome, row = _end(engine, job, Unlaunched("requirements failed", FailureClass.USER_ERROR))
    assert outcome == Outcome.FAILED and row.state == "failed" and row.restarts_used == 0
