"""Postgres restarted mid-run (a real `pg_ctl stop -m fast` and start, not a proxy cut) under a
real Celery worker and a real controller: the server ends every session (open transactions,
the controller's advisory lock), refuses connections while it is down, and comes back empty of
sessions. The worker and its ingest reconnect and store every metric point, log line,
checkpoint record and event once; the controller takes the lead again; nobody is requeued.

The server is a private Postgres of this test (`initdb` in a temporary directory owned by the
`postgres` user, its own port on loopback), so the shared server of the other test sessions
is not disturbed. Skipped where no Postgres binaries or no root (to run them as `postgres`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from core.datasets import service as datasets
from core.platform.db import make_engine, upgrade
from core.platform.settings import Settings
from tests.conftest import make_project
from tests.integration.faults.outages import assert_stored_once
from tests.integration.workers.controllers import Controller, start_controller
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    job_row,
    start_worker,
    submit,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
    wait_step,
)
from workers.launcher import free_port

pytestmark = pytest.mark.long

STEPS = 1200  # ~20 s of training: the run outlasts the outage
DOWN_S = 6.0  # how long the server stays down between its stop and its start
START_S = 60.0  # initdb and a start on a loaded host


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    return found[-1] or None


@dataclass
class PrivatePostgres:
    """A Postgres server of this test: its data directory, port and `pg_ctl`."""

    pg_ctl: str
    data: Path
    port: int

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def ctl(self, *args: str) -> None:
        """`pg_ctl` as the `postgres` user. Raises CalledProcessError with its output."""
        subprocess.run(
            ["runuser", "-u", "postgres", "--", self.pg_ctl, "-D", str(self.data), *args],
            check=True,
            capture_output=True,
            timeout=START_S,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.ctl("-o", options, "-l", str(self.data / "server.log"), "-w", "start")

    def stop(self) -> None:
        """A fast shutdown: every session is ended (`57P01`), open transactions roll back."""
        self.ctl("-m", "fast", "-w", "stop")


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[PrivatePostgres]:
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if os.geteuid() != 0 or not initdb or not pg_ctl or not shutil.which("runuser"):
        pytest.skip("needs root and Postgres' initdb and pg_ctl (run as the postgres user)")
    data = Path(tempfile.mkdtemp(prefix="torchyard-pg-"))  # not under pytest's 0700 root
    shutil.chown(data, "postgres", "postgres")
    server = PrivatePostgres(pg_ctl, data, free_port())
    subprocess.run(
        ["runuser", "-u", "postgres", "--", initdb, "-D", str(data), "-A", "trust", "-U",
         "postgres", "--no-sync", "-E", "UTF8"],
        check=True, capture_output=True, timeout=START_S,
    )  # fmt: skip
    try:
        server.start()
        yield server
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            server.ctl("-m", "immediate", "stop")
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def restart_settings(
    settings: Settings,
    private_postgres: PrivatePostgres,
    tmp_path_factory: pytest.TempPathFactory,
) -> Settings:
    """The suite's settings on a database of the private server, migrated, with a home and
    storage of their own (its job ids start again at 1: the suite's storage has such jobs)."""
    admin = create_engine(private_postgres.url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text('CREATE DATABASE "torchyard"'))
    admin.dispose()
    url = private_postgres.url("torchyard")
    upgrade(url)
    home = tmp_path_factory.mktemp("restart_home")
    return settings.model_copy(
        update={"database_url": url, "home": home, "storage_url": str(home / "storage")}
    )


@pytest.fixture(scope="module")
def restart_engine(restart_settings: Settings) -> Iterator[Engine]:
    eng = make_engine(restart_settings.database_url)
    yield eng
    eng.dispose()


def lock_holders(engine: Engine) -> int:
    """How many sessions hold an advisory lock (the controllers' lead)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
            ).scalar_one()
        )


def test_postgres_restarted_mid_run_loses_and_duplicates_nothing_and_requeues_nobody(
    restart_settings: Settings,
    restart_engine: Engine,
    private_postgres: PrivatePostgres,
    celery_client: Celery,
    worker_logs: Path,
    fleet: list[Worker],
    controllers: list[Controller],
    corpus_dir: Path,
) -> None:
    engine, settings = restart_engine, restart_settings
    project = make_project(engine)
    with Session(engine) as session:
        dataset_id = datasets.register(
            session=session,
            settings=settings,
            project_id=project.project_id,
            name="corpus",
            uri=str(corpus_dir),
        ).id
    worker = start_worker(
        settings=settings, client=celery_client, queue=unique_queue("pgrestart"),
        log_dir=worker_logs,
    )  # fmt: skip
    fleet.append(worker)
    controller = start_controller(controllers, settings, worker_logs)
    wait_for("the controller to lead", lambda: controller.says("controller: leading"), 60, 0.2)
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        train={"max_steps": STEPS},
        eval={"interval_steps": 400},
        checkpoint={"interval_steps": 400, "keep_last": 5},
    )
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, 20, 120)

    private_postgres.stop()
    stopped_at = time.monotonic()
    wait_for("the outage to last its time", lambda: time.monotonic() - stopped_at >= DOWN_S,
             DOWN_S + 5, poll_s=0.5)  # fmt: skip
    private_postgres.start()
    up_at = time.monotonic()
    engine.dispose()  # this process's pooled connections died with the server

    def heartbeat_after_restart() -> datetime | None:
        with engine.connect() as conn:
            beat = conn.execute(
                text("SELECT heartbeat_at FROM workers WHERE name = :n"), {"n": worker.name}
            ).scalar_one()
        fresh = time.time() - beat.replace(tzinfo=UTC).timestamp() < DOWN_S / 2
        return beat if fresh else None  # an older one predates the stop

    wait_for("the worker to beat again", heartbeat_after_restart, 60, 0.1)
    beat_again_s = time.monotonic() - up_at
    wait_for("the controller to lead again", lambda: lock_holders(engine) == 1, 60, 0.1)
    lead_again_s = time.monotonic() - up_at

    running_after = job_row(engine, job_id)
    job = wait_state(engine, job_id, TERMINAL, 240, worker)
    assert job.state == "succeeded", job.error
    assert (job.attempt, job.current_step) == (1, STEPS)  # no requeue: the worker never left
    assert_stored_once(engine, job_id, STEPS, [400, 800, 1200])
    assert "controller: gave up the lead" in controller.log  # it saw the restart ...
    assert controller.log.count("controller: leading") == 2  # ... and leads again, once
    assert lock_holders(engine) == 1
    assert running_after.state == "running"  # ingest after the restart, not only a final flush
    print(f"Postgres down {DOWN_S:.0f} s: worker beating again {beat_again_s:.1f} s and the "
          f"controller leading again {lead_again_s:.1f} s after the start")  # fmt: skip
