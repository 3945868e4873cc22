"""Worker liveness: every worker process writes its row in `workers` every
`worker_heartbeat_interval_s` (2 s) from a daemon thread of its own.

The thread is apart from the supervise loop of any job, so it beats while the worker is idle,
claiming, launching or blocked on a slow database write of a job, and stops only with the
process: a row older than `worker_timeout_s` (10 s) means the process is gone, and the
reconciler (`workers.reconcile`) requeues its jobs as `node_lost`. `started_at` is the
incarnation (Celery's worker start time, before it consumes anything): a worker restarted
under the same name writes a later one, and its predecessor's jobs are requeued at once.

Database errors in the thread are logged (once per outage) and retried at the next beat; they
never reach Celery. `steady_s` says how long the beats have gone through without a gap: the
reconciler judges other workers' silence only when its own process has been in touch with the
database for the whole timeout (after a database outage every row is old, and no worker is
gone for that).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete
from sqlalchemy.orm import Session

from core.platform.db import upsert_insert
from core.platform.settings import Settings, get_settings
from core.platform.tables import Worker, utcnow

log = logging.getLogger(__name__)

# A row not written for this long is deleted when a worker starts (names of hosts long gone).
FORGET_AFTER = timedelta(days=7)


def worker_name(hostname: str | None) -> str:
    """The name a worker records on what it claims and on its row: `worker_hostname` from the
    settings, else Celery's node name (`-n`), else the host name."""
    return get_settings().worker_hostname or hostname or socket.gethostname()


def beat(
    *,
    session: Session,
    name: str,
    pool: str,
    started_at: datetime,
    stopping: bool = False,
    slots_total: int = 1,
    slots_free: int | None = None,
    sandbox: str | None = None,
    now: datetime | None = None,
) -> bool:
    """Write worker `name`'s row (insert or update) with `heartbeat_at` = `now`.

    Returns False, changing nothing, when the row holds a later incarnation (`started_at`):
    another process runs under this name. Does not commit.
    """
    values: dict[str, Any] = {
        "name": name,
        "pool": pool,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started_at": started_at,
        "heartbeat_at": now or utcnow(),
        "slots_total": slots_total,
        "slots_free": slots_free,
        "stopping": stopping,
        "sandbox": sandbox,
    }
    insert = upsert_insert(session, Worker).values(**values)
    upsert = insert.on_conflict_do_update(
        index_elements=[Worker.name],
        set_={k: insert.excluded[k] for k in values if k != "name"},
        where=Worker.started_at <= insert.excluded.started_at,
    )
    return session.execute(upsert.returning(Worker.name)).first() is not None


def forget_gone(*, session: Session, before: datetime) -> int:
    """Delete the rows not written since `before`; returns how many. Does not commit."""
    result: Any = session.execute(delete(Worker).where(Worker.heartbeat_at < before))
    return int(result.rowcount)


class WorkerHeartbeat:
    """The daemon thread that keeps one worker process's row fresh.

    `on_registered` runs once after the first beat went through (retried at every later beat
    until it returns without raising): the worker reconciles its previous incarnation's jobs.
    """

    def __init__(
        self,
        *,
        name: str,
        pool: str,
        started_at: datetime,
        factory: Callable[[], Session],
        settings: Settings,
        on_registered: Callable[[], object] | None = None,
        slots: Callable[[], tuple[int, int]] | None = None,
        sandbox: str | None = None,
    ) -> None:
        """`slots()`: the worker's (total, free) devices at each beat (`workers.devices`);
        `sandbox`: how it contains its jobs (`workers.isolation.sandbox.describe`)."""
        self.name, self.pool, self.started_at = name, pool, started_at
        self.sandbox = sandbox
        self._slots = slots
        self._factory = factory
        self._interval_s = settings.worker_heartbeat_interval_s
        self._on_registered = on_registered
        self._stopping = False
        self._registered = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{name}", daemon=True)
        self._last_ok: float | None = None  # time.monotonic() of the last beat that went through
        self._steady_since: float | None = None
        self._failing_since: float | None = None

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def mark_stopping(self) -> None:
        """The worker's warm shutdown began: the next beat says so."""
        self._stopping = True

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread after a last beat (marked stopping); waits up to `timeout_s` s."""
        self._stopping = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def steady_s(self) -> float:
        """Seconds the beats have gone through without a gap (0 when the last one failed)."""
        since = self._steady_since
        return 0.0 if since is None else time.monotonic() - since

    def _run(self) -> None:
        while not self._stop.is_set():
            self._tick()
            self._stop.wait(self._interval_s)
        self._tick()

    def _tick(self) -> None:
        try:
            total, free = self._slots() if self._slots is not None else (1, None)
            with self._factory() as session:
                if not self._registered:
                    forget_gone(session=session, before=utcnow() - FORGET_AFTER)
                current = beat(
                    session=session,
                    name=self.name,
                    pool=self.pool,
                    started_at=self.started_at,
                    stopping=self._stopping,
                    slots_total=total,
                    slots_free=free,
                    sandbox=self.sandbox,
                )
                session.commit()
        except Exception as exc:  # never let the thread die: the next beat tries again
            self._steady_since = None
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning(
                    "worker %s: heartbeat failed, retrying every %.0f s: %s",
                    self.name,
                    self._interval_s,
                    exc,
                )
            return
        self._went_through()
        if not current:
            log.error(
                "worker %s: a later process (started after %s) runs under this name; names "
                "must be unique",
                self.name,
                self.started_at.isoformat(),
            )
            return
        if not self._registered:
            self._registered = self._run_on_registered()

    def _went_through(self) -> None:
        now = time.monotonic()
        if self._failing_since is not None:
            log.info("worker %s: heartbeat back after %.0f s", self.name, now - self._failing_since)
            self._failing_since = None
        gap = None if self._last_ok is None else now - self._last_ok
        if self._steady_since is None or (gap is not None and gap > 2 * self._interval_s):
            self._steady_since = now
        self._last_ok = now

    def _run_on_registered(self) -> bool:
        if self._on_registered is None:
            return True
        try:
            self._on_registered()
        except Exception:
            log.exception("worker %s: reconciling the previous incarnation failed", self.name)
            return False
        return True
