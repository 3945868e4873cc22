"""A training session (`/tinker`) whose client stopped heartbeating ends at
`session_idle_timeout_s`, on the reconcile loop's round; one that heartbeats stays. Time is
injected (`now`), nothing sleeps. A database of its own: the reconcile of every pool and the
idle scan see every row of the database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from core.platform.db import make_engine, session_factory, session_scope
from core.platform.errors import Gone
from core.platform.settings import Settings
from core.platform.tables import SessionState, TrainingSession, utcnow
from core.sessions import service as sessions
from tests.conftest import fresh_database, make_project
from workers.reconcile import reconcile

NEW = sessions.NewSession(tags=["t"], user_metadata={}, sdk_version="0.38.0")


@pytest.fixture(scope="module")
def own_engine() -> Iterator[Engine]:
    with fresh_database() as url:
        engine = make_engine(url)
        yield engine
        engine.dispose()


def test_a_silent_session_ends_at_its_idle_timeout_and_a_beating_one_stays(
    own_engine: Engine,
) -> None:
    project = make_project(own_engine)
    start = utcnow()
    with session_scope(own_engine) as s:
        silent = sessions.create(
            session=s, project_id=project.project_id, owner="t", new=NEW, now=start
        ).id
        beating = sessions.create(
            session=s, project_id=project.project_id, owner="t", new=NEW, now=start
        ).id
    with session_scope(own_engine) as s:
        sessions.heartbeat(
            session=s,
            project_id=project.project_id,
            session_id=beating,
            now=start + timedelta(seconds=250),
        )
    with session_scope(own_engine) as s:
        assert (
            sessions.end_idle(session=s, idle_timeout_s=300, now=start + timedelta(seconds=300))
            == []
        )
    with session_scope(own_engine) as s:
        ended = sessions.end_idle(session=s, idle_timeout_s=300, now=start + timedelta(seconds=301))
    assert ended == [silent]
    with session_scope(own_engine) as s:
        row = s.get_one(TrainingSession, silent)
        assert row.state == SessionState.ENDED
        assert row.ended_reason == "idle: no heartbeat for 300 s"
        assert s.get_one(TrainingSession, beating).state == SessionState.ACTIVE
        with pytest.raises(Gone):  # its client's next beat is told to stop
            sessions.heartbeat(session=s, project_id=project.project_id, session_id=silent)


def test_the_reconcile_loop_ends_idle_sessions_after_the_setting(own_engine: Engine) -> None:
    project = make_project(own_engine)
    start = utcnow()
    with session_scope(own_engine) as s:
        idle = sessions.create(
            session=s, project_id=project.project_id, owner="t", new=NEW, now=start
        ).id
    settings = Settings(env="test", database_url=str(own_engine.url), session_idle_timeout_s=60)

    def run(after_s: float) -> list[str]:
        report = reconcile(
            settings=settings,
            session_factory=session_factory(own_engine),
            dispatch=lambda job_id, queue: None,
            redispatch_after_s=3600,
            now=start + timedelta(seconds=after_s),
        )
        return report.sessions_ended

    assert run(59) == []
    assert run(61) == [idle]
    assert run(120) == []  # ended once
