"""Engine and session factories, and the "is the schema migrated?" check."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from core.platform.settings import Settings, get_settings

# `Session.info` key of the job dispatch a session sends through (`core.jobs.outbox`)
DISPATCH_INFO_KEY = "torchyard.dispatch"
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


# How long Postgres lets a GPU host's session sit idle inside a transaction before it ends the
# session, releasing its locks (`idle_in_transaction_session_timeout`, set per transaction;
# `get_host_engine`).
HOST_IDLE_IN_TRANSACTION_TIMEOUT_MS = 30_000


def make_engine(database_url: str, *, idle_in_transaction_timeout_ms: int | None = None) -> Engine:
    """An engine for `database_url`. SQLite gets WAL, a busy timeout and enforced foreign keys.

    On Postgres through psycopg (3), no statement is prepared on the server: psycopg prepares a
    query it has run five times on a connection, and behind PgBouncer in transaction pooling
    (README's Deployment) the next transaction may run on another server connection, where
    the prepared name is missing or taken ("prepared statement "_pg3_0" already exists").
    Nothing else here needs a session of its own, except the controller's leader lock, which
    connects to `database_direct_url` (`Settings`).

    With `idle_in_transaction_timeout_ms` (a GPU host's processes: `get_host_engine`) every
    Postgres transaction starts with `SET LOCAL idle_in_transaction_session_timeout`: a host
    that dies or loses its network between a statement and its COMMIT leaves its server session
    idle in the transaction, holding its row locks until the server's TCP keepalive gives up
    (two hours by default). A worker's metrics ingest locks its job's row; the controller's
    UPDATE that ends the lost host's attempt then waited behind it (seen: a cut link's attempt
    never ended in a test's 60 s). Postgres ends such a session after the timeout and the lock
    goes with it. `SET LOCAL`, one statement per transaction, because session settings do not
    survive PgBouncer's transaction pooling, and its 1.18 refuses the `options` startup
    parameter. The API and the controller, beside the database, keep no bound: a request may
    hold its transaction while it reads a dataset of many GB."""
    if database_url.startswith("sqlite"):
        path = database_url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(database_url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    engine = create_engine(
        database_url,
        connect_args=connect_args(database_url),
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        json_deserializer=_json_loads,
    )
    if engine.dialect.name == "postgresql" and idle_in_transaction_timeout_ms is not None:
        ms = idle_in_transaction_timeout_ms
        bound = f"SET LOCAL idle_in_transaction_session_timeout = {ms:d}"

        @event.listens_for(engine, "begin")
        def _bound_idle_transactions(conn) -> None:  # type: ignore[no-untyped-def]
            dbapi = conn.connection.dbapi_connection
            if dbapi.autocommit:  # AUTOCOMMIT (the leader lock's session): no transaction
                return
            with dbapi.cursor() as cur:  # the driver's BEGIN, then this, in one transaction
                cur.execute(bound)

    return engine


def connect_args(database_url: str) -> dict[str, Any]:
    """The driver's arguments of a Postgres engine: psycopg prepares no statement on the server
    (`make_engine`); other drivers (psycopg2) never do."""
    return (
        {"prepare_threshold": None} if make_url(database_url).get_driver_name() == "psycopg" else {}
    )


def _json_loads(raw: str | bytes) -> Any:
    """JSON and JSONB values from Postgres: `orjson` (a jobs-list page decodes 50 specs, ~3x
    faster than the standard library), or the standard library for what orjson refuses
    (integers beyond 64 bits, which JSONB's numeric can hold)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


@lru_cache
def _cached_engine(database_url: str, idle_in_transaction_timeout_ms: int | None) -> Engine:
    return make_engine(database_url, idle_in_transaction_timeout_ms=idle_in_transaction_timeout_ms)


def upsert_insert(session: Session, table: Any) -> Any:
    """An INSERT of `table` that takes `ON CONFLICT` clauses, in the session's dialect
    (Postgres or SQLite)."""
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def get_engine(settings: Settings | None = None) -> Engine:
    return _cached_engine((settings or get_settings()).database_url, None)


def get_host_engine(settings: Settings | None = None) -> Engine:
    """The engine of a process on a GPU host (a Celery worker, a Slurm agent): its transactions
    are bounded by `HOST_IDLE_IN_TRANSACTION_TIMEOUT_MS` idle (`make_engine`), so that a host
    lost mid-transaction cannot hold a job's row from the controller for hours."""
    url = (settings or get_settings()).database_url
    return _cached_engine(url, HOST_IDLE_IN_TRANSACTION_TIMEOUT_MS)


def session_factory(
    engine: Engine, dispatch: Callable[[int, str], Any] | None = None
) -> sessionmaker[Session]:
    """Sessions on `engine`; with `dispatch`, each sends the run message of every job its
    transaction queued after the commit (`core.jobs.outbox`, whose `Session.info` key this
    sets: `core.platform` does not import `core.jobs`)."""
    info = {DISPATCH_INFO_KEY: dispatch} if dispatch is not None else None
    return sessionmaker(bind=engine, expire_on_commit=False, info=info)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with session_factory(engine)() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def alembic_config(database_url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str) -> None:
    """Apply all migrations (`alembic upgrade head`)."""
    from alembic import command

    command.upgrade(alembic_config(database_url), "head")


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return MigrationContext.configure(conn).get_current_revision()


class SchemaNotMigrated(RuntimeError):
    """The database is not at the migrations' head revision."""


def check_migrated(engine: Engine) -> None:
    """Raise SchemaNotMigrated with the command that fixes it, unless the DB is at head."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaNotMigrated(
            f"database {engine.url.render_as_string(hide_password=True)} is at revision "
            f"{current or '(none)'}, code needs {head}: run `torchyard admin migrate`"
        )
