"""The controller (`python -m workers controller`, `workers.controller`): the reconcile loop in
a process of its own, so a lost worker's job is requeued even when no worker has an idle
thread for beat's `workers.reconcile` messages (issue 26: a busy deployment's killed worker
left its job `running` for 333 s). Several may run; one leads (a Postgres advisory lock) and a
standby takes over when the leader dies. Real processes: controllers, a Celery worker on the
solo pool (busy with its job, so it runs no reconcile) and its torchrun, Postgres, Redis."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from core.platform.control import ReconcilerHealth, reconciler_health
from core.platform.db import make_engine, session_factory
from core.platform.settings import Settings
from core.platform.tables import Controller as ControllerRow
from tests.conftest import ProjectKey
from tests.integration.workers.archives import UNTIL_STOPPED, steps_spec
from tests.integration.workers.controllers import Controller, start_controller
from tests.integration.workers.helpers import (
    Worker,
    job_events,
    job_row,
    kill_tree,
    start_worker,
    submit,
    unique_queue,
    wait_for,
    wait_state,
    wait_step,
)
from tests.support.figures import bound, record
from workers.controller import Identity, Leadership, Steadiness, run_round

# The promise: a lost worker's job is back in the queue within this (worker_timeout_s 10 s,
# a reconcile every 2 s, the requeue's own transaction).
REQUEUE_WITHIN_S = 15.0
# A standby tries the lock every reconcile interval (2 s); a process's start is not counted.
TAKEOVER_WITHIN_S = 10.0
START_S = 60.0  # a controller's imports and first round, on a loaded host


def _advisory_holders(engine: Engine) -> int:
    """Advisory locks held in this test's database: pg_locks spans the server, where the other
    xdist workers' controllers hold theirs in their own databases."""
    with engine.connect() as conn:
        query = (
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database"
            " = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return int(conn.execute(text(query)).scalar_one())


def test_one_controller_leads_and_a_standby_takes_over_within_seconds_of_its_death(
    engine: Engine, settings: Settings, worker_logs: Path, controllers: list[Controller]
) -> None:
    first = start_controller(controllers, settings, worker_logs)
    wait_for("the first controller to lead", lambda: first.says("controller: leading"), START_S)
    wait_for("its reconcile to be recorded", lambda: _reconciled(engine, first), START_S)
    second = start_controller(controllers, settings, worker_logs)
    wait_for("the second to stand by", lambda: second.says("standing by"), START_S)
    assert not second.says("controller: leading")
    assert _advisory_holders(engine) == 1

    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    killed, killed_at = time.monotonic(), datetime.now(UTC)
    wait_for(
        "the standby to lead", lambda: second.says("controller: leading"), bound(TAKEOVER_WITHIN_S)
    )
    took = time.monotonic() - killed
    record("leader killed -> standby leads", took, TAKEOVER_WITHIN_S)
    assert _advisory_holders(engine) == 1
    # /readyz's source: the last reconcile is the new leader's, and recent
    wait_for(
        "the new leader's reconcile to be recorded",
        lambda: _reconciled(engine, second, after=killed_at),
        TAKEOVER_WITHIN_S,
    )
    assert _health(engine).state == "ok"
    print(f"leader SIGKILLed -> standby leading in {took:.1f} s")


def _health(engine: Engine) -> ReconcilerHealth:
    with Session(engine) as session:
        return reconciler_health(session, datetime.now(UTC))


def _reconciled(engine: Engine, controller: Controller, after: datetime | None = None) -> bool:
    """Whether `controller`'s row (`host:pid`) records a reconcile (after `after`)."""
    name = f"{socket.gethostname()}:{controller.proc.pid}"
    with Session(engine) as session:
        at = session.scalar(select(ControllerRow.reconciled_at).where(ControllerRow.name == name))
    return at is not None and (after is None or at.astimezone(UTC) > after)


def test_a_busy_workers_killed_job_is_requeued_within_15_s_by_the_controller_alone(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    steps_code: str,
    controllers: list[Controller],
) -> None:
    """One worker (solo pool: busy with the job, it would run no reconcile), no beat: only the
    controller can notice that the worker was SIGKILLed with its trainer."""
    controller = start_controller(controllers, settings, worker_logs)
    wait_for("the controller to lead", lambda: controller.says("controller: leading"), START_S)
    worker: Worker = start_worker(
        settings=settings,
        client=celery_client,
        queue=unique_queue("ctl"),
        log_dir=worker_logs,
    )
    try:
        spec = steps_spec(
            steps_code,
            pool=worker.queue,
            steps=UNTIL_STOPPED,
            step_s=0.1,
            retries={"max_restarts": 1},
        )
        job_id = submit(engine, celery_client, project, spec)
        wait_step(engine, job_id, 2, START_S, "the job")
        kill_tree(worker)
        killed = time.monotonic()
        job = wait_state(engine, job_id, ("queued",), bound(REQUEUE_WITHIN_S), worker)
        took = time.monotonic() - killed
        record("worker killed -> controller requeues", took, REQUEUE_WITHIN_S)
    finally:
        worker.stop()
    assert job.failure is not None and job.failure["class"] == "node_lost", job.failure
    assert "no worker heartbeat" in job.failure["reason"], job.failure
    (restarting,) = [e for e in job_events(engine, job_id) if e.state_to == "restarting"]
    assert restarting.data["failure_class"] == "node_lost"
    assert job_row(engine, job_id).restarts_used == 1
    print(f"busy worker SIGKILLed -> job requeued by the controller in {took:.1f} s")


@pytest.fixture
def two_engines(settings: Settings) -> Iterator[tuple[Engine, Engine]]:
    """Two engines on the test database, as two controller processes would have."""
    engines = (make_engine(settings.database_url), make_engine(settings.database_url))
    yield engines
    for e in engines:
        e.dispose()


def test_on_postgres_one_leadership_holds_the_lock_until_it_lets_go(
    two_engines: tuple[Engine, Engine], tmp_path: Path
) -> None:
    first, second = (Leadership(e, tmp_path) for e in two_engines)
    assert first.hold() and first.leading
    assert not second.hold() and not second.leading
    assert first.hold()  # kept, on the same session
    first.drop()
    assert second.hold()
    assert not first.hold()
    second.drop()


def test_on_sqlite_the_lead_is_an_flock_of_the_home(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'torchyard.db'}")
    try:
        first, second = Leadership(engine, tmp_path), Leadership(engine, tmp_path)
        assert first.hold() and not second.hold()
        first.drop()
        assert second.hold() and not first.hold()
        second.drop()
    finally:
        engine.dispose()


def test_steadiness_counts_from_the_first_contact_after_the_last_gap() -> None:
    now = [100.0]
    steady = Steadiness(clock=lambda: now[0])
    assert steady.seconds() == 0.0
    steady.touched()
    now[0] = 112.0
    steady.touched()  # a later contact does not restart the count
    assert steady.seconds() == 12.0
    steady.broke()
    assert steady.seconds() == 0.0
    steady.touched()
    now[0] = 115.0
    assert steady.seconds() == 3.0


def test_a_round_without_the_database_gives_up_the_lead_and_the_steadiness(
    settings: Settings, tmp_path: Path
) -> None:
    """Nothing listens on port 1: the round logs and returns; it neither raises nor reconciles."""
    engine = make_engine("postgresql+psycopg://postgres@127.0.0.1:1/none")
    try:
        leadership, steady = Leadership(engine, tmp_path), Steadiness()
        steady.touched()
        sent: list[tuple[int, str]] = []
        factory = session_factory(engine)
        send = lambda j, q: sent.append((j, q))  # noqa: E731
        run_round(settings, leadership, steady, factory, send, Identity())
        assert (leadership.leading, steady.seconds(), sent) == (False, 0.0, [])
    finally:
        engine.dispose()
