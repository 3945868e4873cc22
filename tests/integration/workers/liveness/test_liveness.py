"""A worker's heartbeat thread: its row in `workers`, database outages ridden out, incarnations."""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.tables import Worker, utcnow
from tests.integration.workers.helpers import wait_for
from workers import liveness


@pytest.fixture
def unreachable() -> Iterator[Engine]:
    """A Postgres nobody listens for (connection refused at once)."""
    dead = create_engine(
        "postgresql+psycopg://postgres@127.0.0.1:1/none", connect_args={"connect_timeout": 1}
    )
    yield dead
    dead.dispose()


def _row(engine: Engine, name: str) -> Worker | None:
    with Session(engine, expire_on_commit=False) as s:
        return s.get(Worker, name)


def _stopping(engine: Engine, name: str) -> bool:
    row = _row(engine, name)
    return row is not None and row.stopping


def test_the_heartbeat_rides_out_a_database_outage_and_registers_once_it_is_back(
    engine: Engine,
    unreachable: Engine,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fast = settings.model_copy(update={"worker_heartbeat_interval_s": 0.1})
    down = threading.Event()
    down.set()

    def factory() -> Session:  # the database is away while `down` is set
        return Session(unreachable if down.is_set() else engine, expire_on_commit=False)

    registered: list[float] = []
    name, long_gone = (f"w-{secrets.token_hex(3)}@liveness" for _ in range(2))
    with Session(engine) as s:  # a host that left more than FORGET_AFTER ago
        last_seen = utcnow() - liveness.FORGET_AFTER - timedelta(hours=1)
        liveness.beat(session=s, name=long_gone, pool="old", started_at=last_seen, now=last_seen)
        s.commit()
    heartbeat = liveness.WorkerHeartbeat(
        name=name,
        pool="liveness",
        started_at=utcnow(),
        factory=factory,
        settings=fast,
        on_registered=lambda: registered.append(heartbeat.steady_s()),
    )
    caplog.set_level(logging.INFO, logger=liveness.__name__)
    heartbeat.start()
    try:
        wait_for("a failed beat", lambda: "heartbeat failed" in caplog.text, 10)
        assert heartbeat.steady_s() == 0.0 and registered == []
        down.clear()
        wait_for("the row", lambda: _row(engine, name), 10)
        wait_for("the previous incarnation's jobs reconciled", lambda: registered, 5)
        wait_for("steady beats", lambda: heartbeat.steady_s() >= 0.5, 10)
        assert len(registered) == 1  # once, not at every beat
        assert _row(engine, long_gone) is None  # forgotten when a worker registers
        failures = [r for r in caplog.records if "heartbeat failed" in r.getMessage()]
        assert len(failures) == 1  # once per outage, not once per beat
        assert "heartbeat back after" in caplog.text
        heartbeat.mark_stopping()
        wait_for("the row to say stopping", lambda: _stopping(engine, name), 5)
    finally:
        heartbeat.stop()
    assert not heartbeat.alive


def test_a_later_incarnation_keeps_the_name_from_an_earlier_one(engine: Engine) -> None:
    name = f"w-{secrets.token_hex(3)}@liveness"
    earlier, later = utcnow() - timedelta(minutes=5), utcnow()
    with Session(engine) as s:
        assert liveness.beat(session=s, name=name, pool="a", started_at=earlier)
        assert liveness.beat(session=s, name=name, pool="b", started_at=later)
        assert not liveness.beat(session=s, name=name, pool="c", started_at=earlier)
        s.commit()
    row = _row(engine, name)
    assert row is not None and (row.pool, row.started_at) == ("b", later)


def test_a_worker_timeout_under_two_heartbeat_intervals_is_refused() -> None:
    """Live workers would count as gone between two beats."""
    with pytest.raises(ValueError, match="at least twice"):
        Settings(worker_heartbeat_interval_s=6.0, worker_timeout_s=10.0)
    assert Settings(worker_heartbeat_interval_s=5.0, worker_timeout_s=10.0).worker_timeout_s == 10
