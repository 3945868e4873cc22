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


def make_engine(database_url: str) -> Engine:
    """An engine for `database_url`. SQLite gets WAL, a busy timeout and enforced foreign keys.

    On Postgres through psycopg (3), no statement is prepared on the server: psycopg prepares a
    query it has run five times on a connection, and behind PgBouncer in transaction pooling
    (README's Deployment) the next transaction may run on another server connection, where
    the prepared name is missing or taken ("prepared statement "_pg3_0" already exists").
    Nothing else here needs a session of its own, except the controller's leader lock, which
    connects to `database_direct_url` (`Settings`)."""
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
    return create_engine(
        database_url,
        connect_args=connect_args(database_url),
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        json_deserializer=_json_loads,
    )


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
def _cached_engine(database_url: str) -> Engine:
    return make_engine(database_url)


def upsert_insert(session: Session, table: Any) -> Any:
    """An INSERT of `table` that takes `ON CONFLICT` clauses, in the session's dialect
    (Postgres or SQLite)."""
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def get_engine(settings: Settings | None = None) -> Engine:
    return _cached_engine((settings or get_settings()).database_url)


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
