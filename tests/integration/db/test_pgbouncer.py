"""Through PgBouncer in transaction pooling (scripts/services.sh starts it on 127.0.0.1:6432, as
production puts it in front of Postgres for the API and the workers: README's Deployment), the
product's engines work: a transaction may run on any server connection, so nothing may rely on
a server session outliving it (prepared statements, `options` at connect); and the controller,
whose leader lock is one, connects to Postgres itself (`Settings.direct_database_url`)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import optuna
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from core.platform.db import make_engine
from core.platform.settings import Settings
from core.platform.tables import Controller
from core.sweeps import study
from workers import controller

PGBOUNCER_PORT = int(os.environ.get("TORCHYARD_TEST_PGBOUNCER_PORT", "6432"))


def _pooled(postgres_url: str) -> str:
    return make_url(postgres_url).set(port=PGBOUNCER_PORT).render_as_string(hide_password=False)


def test_one_query_run_often_on_many_connections_needs_no_server_side_prepared_statement(
    postgres_url: str,
) -> None:
    """psycopg prepares a query on its fifth run; a later transaction on another server
    connection then found `_pg3_0` missing or taken (DuplicatePreparedStatement) before
    `make_engine` turned that off."""
    engine = make_engine(_pooled(postgres_url))
    failures: list[BaseException] = []

    def client() -> None:
        try:
            for i in range(20):
                with engine.connect() as conn:
                    conn.execute(text("SELECT count(*) FROM jobs WHERE id > :i"), {"i": i})
                    conn.commit()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.dispose()
    assert not failures, failures[0]


def test_optuna_keeps_its_tables_in_its_schema_through_the_pooler(postgres_url: str) -> None:
    """Its search path was a libpq `options` at connect, which PgBouncer refuses ("unsupported
    startup parameter"); set per transaction, its tables and its own `alembic_version` are in
    `optuna` and ours is untouched."""
    pooled = _pooled(postgres_url)
    name = f"pooled-{time.monotonic_ns()}"
    the_study = optuna.create_study(storage=study.storage(pooled), study_name=name)
    for value in (3.0, 1.0, 2.0):
        trial = the_study.ask()
        the_study.tell(trial, value)
    assert optuna.load_study(study_name=name, storage=study.storage(pooled)).best_value == 1.0
    direct = create_engine(postgres_url)
    with direct.connect() as conn:
        schemas = conn.execute(
            text(
                "SELECT table_name, table_schema FROM information_schema.tables"
                " WHERE table_name IN ('studies', 'trials')"
            )
        ).all()
        ours = conn.scalar(text("SELECT version_num FROM public.alembic_version"))
    direct.dispose()
    assert sorted(schemas) == [("studies", "optuna"), ("trials", "optuna")]
    assert ours is not None and not ours.startswith("v")  # Optuna's revisions are "v3.2.0.a"


def test_the_controller_leads_through_its_direct_url_not_the_pooled_one(
    settings: Settings, postgres_url: str, tmp_path: Path
) -> None:
    """A session-level advisory lock through a transaction pooler is held by whichever server
    connection ran it, for whichever client gets that one next: the controller must not use
    `database_url` there. With the pooled URL unreachable, it leads all the same."""
    ours = settings.model_copy(
        update={
            "database_url": "postgresql+psycopg://postgres@127.0.0.1:1/unreachable",
            "database_direct_url": postgres_url,
            "home": tmp_path,
        }
    )
    stop = threading.Event()
    thread = threading.Thread(
        target=controller.run,
        args=(ours,),
        kwargs={"stop": stop, "interval_s": 0.2, "dispatch": lambda *_: None},
    )
    started = time.monotonic()
    thread.start()
    engine = make_engine(postgres_url)
    me = f"{socket.gethostname()}:{os.getpid()}"
    try:
        leading = False
        while not leading and time.monotonic() - started < 30:
            time.sleep(0.2)
            with engine.connect() as conn:
                leading = bool(conn.scalar(select(Controller.leading).where(Controller.name == me)))
    finally:
        stop.set()
        thread.join(30)
        engine.dispose()
    assert leading
