"""Issue 46: one door for every job (`core.submission.service.submit`) and its run message sent
only after the commit that made the job (`core.jobs.outbox`), through the dispatch the session
was bound to. Real Postgres; the dispatch is a recorder that reads the job back from another
session when it is called, so "after the commit" is observed, not assumed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from core.jobs import outbox
from core.platform.db import session_factory
from core.platform.errors import QuotaExceeded
from core.platform.settings import Settings
from core.platform.tables import Job, JobEvent
from core.scheduling import quotas
from core.submission import service as submission
from jobspec.job import parse_job_spec
from tests.conftest import ProjectKey
from tests.integration.api.conftest import job_spec, queued_job_ids

Sent = list[tuple[int, str, bool]]


def _recorder(engine: Engine, sent: Sent) -> Callable[[int, str], None]:
    """A dispatch that records (job id, pool, whether another session sees the job's row)."""

    def dispatch(job_id: int, pool: str) -> None:
        with session_factory(engine)() as other:
            sent.append((job_id, pool, other.get(Job, job_id) is not None))

    return dispatch


def _origin(engine: Engine, job_id: int) -> Any:
    with session_factory(engine)() as s:
        event = s.scalars(select(JobEvent).where(JobEvent.job_id == job_id)).first()
        assert event is not None
        return (event.state_to, (event.data or {}).get("origin"))


def test_every_door_sends_its_job_once_after_the_commit_and_a_replay_sends_nothing(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
) -> None:
    sent: Sent = []
    make = session_factory(engine, dispatch=_recorder(engine, sent))
    spec = parse_job_spec(job_spec(dataset["id"], resources={"pool": pool}))
    with make() as session:
        made = submission.submit(
            session=session,
            settings=settings,
            project_id=project.project_id,
            spec=spec,
            owner="k",
            door=submission.API,
            idempotency_key="door-1",
        )
        again = submission.submit(
            session=session,
            settings=settings,
            project_id=project.project_id,
            spec=spec,
            owner="k",
            door=submission.API,
            idempotency_key="door-1",
        )
    assert made.created and not again.created and again.job.id == made.job.id
    assert sent == [(made.job.id, pool, True)]  # once, and the row was committed by then
    assert _origin(engine, made.job.id) == ("queued", "api")

    # a door that inserts into the caller's transaction: nothing leaves on a rollback
    sent.clear()
    with make() as session:
        kept_out = submission.submit(
            session=session,
            settings=None,
            project_id=project.project_id,
            spec=spec,
            owner="k",
            door=submission.EVAL_AFTER,
        )
        assert outbox.pending(session) == [(kept_out.job.id, pool)]
        session.rollback()
        assert outbox.pending(session) == []
        kept = submission.submit(
            session=session,
            settings=None,
            project_id=project.project_id,
            spec=spec,
            owner="k",
            door=submission.EVAL_AFTER,
        )
        assert sent == []  # not before the commit
        session.commit()
    assert sent == [(kept.job.id, pool, True)]
    assert _origin(engine, kept.job.id) == ("queued", "eval_after")


def test_a_savepoint_after_the_submit_sends_nothing_before_the_outer_commit(
    engine: Engine, project: ProjectKey, dataset: dict[str, Any], pool: str
) -> None:
    """SQLAlchemy runs `after_commit` when a savepoint is released: a session call stores its
    request in one (`core.sessions.requests.add`) after the submit of its job, and the run
    message left then, before the job's row was committed: the worker found the job gone and
    the session's first call waited forever (CI at stops 54 and 55)."""
    sent: Sent = []
    make = session_factory(engine, dispatch=_recorder(engine, sent))
    spec = parse_job_spec(job_spec(dataset["id"], resources={"pool": pool}))
    with make() as session:
        made = submission.submit(
            session=session,
            settings=None,
            project_id=project.project_id,
            spec=spec,
            owner="k",
            door=submission.EVAL_AFTER,  # a door that leaves the commit to its caller
        )
        with session.begin_nested():
            session.add(JobEvent(job_id=made.job.id, kind="note", message="in a savepoint"))
        assert sent == []  # the savepoint's release sends nothing
        assert outbox.pending(session) == [(made.job.id, pool)]
        session.commit()
    assert sent == [(made.job.id, pool, True)]


def test_the_queue_quota_holds_at_every_door_but_an_evaluation_owed_to_a_finished_run(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
) -> None:
    """The OpenAI view's door made jobs past `max_queued_jobs` before there was one door."""
    make = session_factory(engine)
    spec = parse_job_spec(job_spec(dataset["id"], resources={"pool": pool}))
    with make() as session:
        quotas.put_quota(
            session=session, project_id=project.project_id, pool=pool, values={"max_queued_jobs": 1}
        )

        def submit(door: submission.Door) -> Any:
            return submission.submit(
                session=session,
                settings=settings,
                project_id=project.project_id,
                spec=spec,
                owner="k",
                door=door,
            )

        submit(submission.API)
        session.commit()
        for door in (submission.API, submission.OPENAI, submission.SWEEP):
            with pytest.raises(QuotaExceeded):
                submit(door)
            session.rollback()
        owed = submit(submission.EVAL_AFTER)
        session.commit()
    assert _origin(engine, owed.job.id) == ("queued", "eval_after")


def test_the_api_route_dispatches_through_the_outbox(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str, settings: Settings
) -> None:
    """`POST /v1/jobs` and `retry` send one message each, after their commits (the route no
    longer calls the dispatcher itself)."""
    answer = client.post(
        "/v1/jobs", json=job_spec(dataset["id"], resources={"pool": pool}), headers=project.headers
    )
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    assert queued_job_ids(settings.broker_url, pool) == [job_id]
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=project.headers).status_code == 202
    assert client.post(f"/v1/jobs/{job_id}/retry", headers=project.headers).status_code == 202
    assert queued_job_ids(settings.broker_url, pool) == [job_id, job_id]
