"""The controller: the reconcile loop (`workers.reconcile`) in a process of its own.

Celery beat only *sends* `workers.reconcile` messages; they run on whichever worker has an
idle thread, and a GPU worker whose every device is busy, the normal state of a cluster, has
none: lost-worker detection, hang handling, preemption and gang timeouts then stop unseen
(issue 26: a killed worker's job stayed `running` 333 s). The controller runs the reconcile
itself, every `RECONCILE_INTERVAL_S`, whatever the workers are doing:

    python -m workers controller        # or `torchyard controller` (`torchyard beat`)

Run one or more per deployment: exactly one leads. On Postgres the leader holds a
session-level advisory lock (`pg_try_advisory_lock(LOCK_KEY)`) on a connection of its own;
the others try it every interval, so when the leader dies (its connection closes with it) a
standby leads within an interval or two. A pooler in transaction mode would hand that session's
server connection to others between statements, so the controller connects to
`database_direct_url` (Postgres itself), not PgBouncer. On SQLite (the embedded default, one
host) the lock is an `flock` on `<home>/controller.lock`.

Silence (a worker's or a heartbeat's) is judged only once this process has been in touch with
the database for `worker_timeout_s` without a gap (`reconcile`'s `steady_s`): a standby that
polled the lock all along judges at once when it takes over; one that just came back from a
database outage waits, so a gap of its own is never taken for dead workers.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO

from sqlalchemy import Connection, Engine, func, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from core.platform import control
from core.platform.control import RECONCILE_INTERVAL_S
from core.platform.db import make_engine, session_factory
from core.platform.logs import configure_json_logging
from core.platform.settings import Settings, get_settings
from core.platform.tables import utcnow
from core.sweeps import drive as sweeps
from workers import reconcile as reconciler

log = logging.getLogger(__name__)

# The advisory lock's key: "tyctl" as an integer, unlikely to collide with an application's.
LOCK_KEY = int.from_bytes(b"tyctl", "big")
LOCK_FILE = "controller.lock"


class Leadership:
    """Whether this process leads: a Postgres advisory lock held on a connection of its own,
    or an `flock` on `home/controller.lock` for SQLite. `hold()` takes or keeps it and says
    whether this process has it; raises `SQLAlchemyError` when the database cannot be asked."""

    def __init__(self, engine: Engine, home: Path) -> None:
        self.engine = engine
        self.home = home
        self._conn: Connection | None = None
        self._file: IO[bytes] | None = None
        self.standing_by = False  # the last round found another process leading

    @property
    def leading(self) -> bool:
        return self._conn is not None or self._file is not None

    def hold(self) -> bool:
        if self.engine.dialect.name != "postgresql":
            return self._hold_file()
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT 1"))  # still the lock's session
                return True
            except SQLAlchemyError:
                self.drop()
                raise
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            got = bool(conn.execute(select(func.pg_try_advisory_lock(LOCK_KEY))).scalar())
        except SQLAlchemyError:
            conn.invalidate()
            conn.close()
            raise
        if not got:
            conn.close()
            return False
        self._conn = conn
        return True

    def _hold_file(self) -> bool:
        if self._file is not None:
            return True
        self.home.mkdir(parents=True, exist_ok=True)
        handle = (self.home / LOCK_FILE).open("ab")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._file = handle
        return True

    def drop(self) -> None:
        """Give the lead up: the lock is released on its session (so another process can
        take it as soon as this returns: a closed socket alone frees it only once the server
        has noticed), then the connection is discarded, the file closed."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(SQLAlchemyError):  # gone already, and the lock with it
                conn.execute(select(func.pg_advisory_unlock(LOCK_KEY)))
            try:
                conn.invalidate()  # never back to the pool with the lock held
                conn.close()
            except SQLAlchemyError:
                pass
        if self._file is not None:
            self._file.close()
            self._file = None


class Steadiness:
    """Seconds this process has been in touch with the database without a gap."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._since: float | None = None

    def touched(self) -> None:
        if self._since is None:
            self._since = self.clock()

    def broke(self) -> None:
        self._since = None

    def seconds(self) -> float:
        return 0.0 if self._since is None else self.clock() - self._since


class Identity:
    """This process as the `controllers` table names it (`core.platform.control`)."""

    def __init__(self) -> None:
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.name = f"{self.host}:{self.pid}"
        self.started_at = utcnow()

    def record(self, factory: Callable[[], Session], *, leading: bool, reconciled: bool) -> None:
        """Write this round to the `controllers` table. Raises `SQLAlchemyError`."""
        with factory() as session:
            control.record_round(
                session,
                name=self.name,
                host=self.host,
                pid=self.pid,
                started_at=self.started_at,
                leading=leading,
                reconciled=reconciled,
                now=utcnow(),
            )


class Sweeper:
    """The sweeps' round (`core.sweeps.drive`) in a thread of its own, so that however long it
    takes (Optuna's asks and tells, many sweeps) the reconcile loop keeps its interval: lost
    workers are noticed on time. `kick` starts a round unless one is still running."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def kick(
        self, settings: Settings, factory: Callable[[], Session], dispatch: reconciler.Dispatch
    ) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(
            target=self._round, args=(settings, factory, dispatch), name="sweeps", daemon=True
        )
        self._thread.start()

    @staticmethod
    def _round(
        settings: Settings, factory: Callable[[], Session], dispatch: reconciler.Dispatch
    ) -> None:
        try:
            sweeps.advance_all(session_factory=factory, settings=settings, dispatch=dispatch)
        except Exception:  # a database outage or a bug: the next kick tries again
            log.exception("controller: the sweeps' round failed")

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


def run(
    settings: Settings,
    *,
    stop: threading.Event,
    interval_s: float = RECONCILE_INTERVAL_S,
    dispatch: reconciler.Dispatch | None = None,
) -> None:
    """Lead or stand by until `stop` is set: each `interval_s`, take or keep the lead and, when
    leading, reconcile once. A database error ends neither: the lead is given up, the
    steadiness restarts, and the next round tries again."""
    if dispatch is None:
        from workers.tasks import dispatch as send_run_job

        dispatch = send_run_job
    engine = make_engine(settings.direct_database_url)  # never through a transaction pooler
    factory = session_factory(engine)
    leadership = Leadership(engine, settings.home)
    steady = Steadiness()
    me = Identity()
    sweeper = Sweeper()
    try:
        while not stop.is_set():
            started = time.monotonic()
            run_round(settings, leadership, steady, factory, dispatch, me, sweeper)
            stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
    finally:
        sweeper.join(interval_s)
        leadership.drop()
        engine.dispose()


def run_round(
    settings: Settings,
    leadership: Leadership,
    steady: Steadiness,
    factory: Callable[[], Session],
    dispatch: reconciler.Dispatch,
    me: Identity,
    sweeper: Sweeper | None = None,
) -> None:
    """One round: take or keep the lead and, leading, reconcile once (`dispatch` sends a
    queued job's message again), record the round as `me` in the `controllers` table, so
    `GET /readyz` can tell when no reconcile ran for a while, then start the sweeps' round
    (`core.sweeps.drive`: trials ended and started) in `sweeper`'s thread, if one is given and
    its last round is over. Nothing is raised: a database
    error gives up the lead and the steadiness until the database answers again; any other
    error is logged with its traceback and the next round runs as usual."""
    was_leading = leadership.leading
    try:
        leading = leadership.hold()
        steady.touched()
        if leading and not was_leading:
            log.info("controller: leading (pid %d)", os.getpid())
        if not leading:
            if not leadership.standing_by:
                log.info("controller: another process leads; standing by")
            leadership.standing_by = True
            me.record(factory, leading=False, reconciled=False)
            return
        leadership.standing_by = False
        reconciler.reconcile_deployed(
            settings=settings, session_factory=factory, dispatch=dispatch, steady_s=steady.seconds()
        )
        me.record(factory, leading=True, reconciled=True)
        if sweeper is not None:
            sweeper.kick(settings, factory, dispatch)
    except SQLAlchemyError as exc:
        steady.broke()
        if was_leading:  # hold() has dropped the lead already when the lock's session died
            log.warning("controller: gave up the lead: %s", type(exc).__name__)
        leadership.drop()
        log.warning("controller: database unreachable: %s", exc)
    except Exception:  # a bug or a broker outage must not end the loop: the next round retries
        log.exception("controller: the round failed")


def main() -> None:
    """`python -m workers controller`: run until SIGTERM or SIGINT."""
    configure_json_logging("")
    logging.getLogger().setLevel(logging.INFO)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("controller: started (pid %d), standing by for the lead", os.getpid())
    run(get_settings(), stop=stop)
