"""A session that goes silent inside a transaction cannot hold its row locks for long: Postgres
ends it after `idle_in_transaction_session_timeout`, which a GPU host's engine
(`get_host_engine`) sets on every transaction (`SET LOCAL`, so that it holds through
PgBouncer's transaction pooling too).

The case it is for: a host that dies or loses its network between a statement and its COMMIT
(a worker's metrics ingest locks its job's row). Here the silent host is a connection that
locks a row and then sends nothing; another one's UPDATE of that row must go through once
the first session is ended, within the timeout plus the server's check. Without the setting
the UPDATE waits until the server's TCP keepalive gives up (two hours), so the second
connection carries a `lock_timeout` beyond which the test fails instead of hanging."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, OperationalError

from core.platform.db import (
    HOST_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    connect_args,
    get_engine,
    get_host_engine,
    make_engine,
)
from core.platform.settings import Settings
from tests.integration.db.test_pgbouncer import _pooled

TIMEOUT_MS = 1_000  # this test's bound (a host's is HOST_IDLE_IN_TRANSACTION_TIMEOUT_MS)
WAITS_AT_MOST_S = 20  # the other UPDATE's lock_timeout: far past TIMEOUT_MS, far below hours


@pytest.fixture
def row(postgres_url: str) -> Iterator[str]:
    """A table of one row in a schema of this test's own (the product's tables stay as they
    are); its qualified name."""
    schema = f"idle_probe_{secrets.token_hex(3)}"
    admin = create_engine(postgres_url, connect_args=connect_args(postgres_url))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
        conn.execute(text(f"CREATE TABLE {schema}.probe (id int PRIMARY KEY, n int)"))
        conn.execute(text(f"INSERT INTO {schema}.probe VALUES (1, 0)"))
    yield f"{schema}.probe"
    with admin.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    admin.dispose()


@pytest.mark.parametrize("through", ["postgres", "pgbouncer"])
def test_a_session_silent_in_a_transaction_is_ended_and_its_row_lock_released(
    postgres_url: str, through: str, row: str
) -> None:
    url = postgres_url if through == "postgres" else _pooled(postgres_url)
    silent = make_engine(url, idle_in_transaction_timeout_ms=TIMEOUT_MS)
    other = create_engine(url, connect_args=connect_args(url))
    holder = silent.connect()
    try:
        holder.execute(text(f"UPDATE {row} SET n = n + 1 WHERE id = 1"))
        # ... and nothing more: the host is gone, its transaction open, the row locked.
        start = time.monotonic()
        with other.connect() as conn:
            conn.execute(text(f"SET lock_timeout = '{WAITS_AT_MOST_S}s'"))
            conn.execute(text(f"UPDATE {row} SET n = n + 1 WHERE id = 1"))
            conn.commit()
        waited = time.monotonic() - start
        assert waited >= TIMEOUT_MS / 1000 * 0.9  # it did wait for the lock, then got it
        with pytest.raises((OperationalError, DBAPIError)):  # the silent session was ended
            holder.execute(text("SELECT 1"))
    finally:
        holder.invalidate()  # a failed run must not leave the lock to the fixture's DROP
        holder.close()
        silent.dispose()
        other.dispose()


def test_a_hosts_engine_bounds_idle_transactions_and_the_apis_does_not(settings: Settings) -> None:
    with get_host_engine(settings).connect() as conn:
        shown = conn.scalar(text("SHOW idle_in_transaction_session_timeout"))
    assert shown == f"{HOST_IDLE_IN_TRANSACTION_TIMEOUT_MS // 1000}s"
    with get_engine(settings).connect() as conn:  # the API's: a request may read a big dataset
        assert conn.scalar(text("SHOW idle_in_transaction_session_timeout")) == "0"


def test_an_autocommit_session_such_as_the_leader_locks_is_sent_no_set_local(
    postgres_url: str,
) -> None:
    """`SET LOCAL` outside a transaction block does nothing but draw a WARNING, which the
    controller's leader session would then draw on every round (`Leadership.hold`)."""
    engine = make_engine(postgres_url, idle_in_transaction_timeout_ms=TIMEOUT_MS)
    notices: list[str] = []
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        dbapi.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
        assert conn.scalar(text("SELECT 1")) == 1
    with engine.connect() as conn:  # and a transaction still gets its bound
        conn.connection.dbapi_connection.add_notice_handler(  # type: ignore[union-attr]
            lambda d: notices.append(str(d.message_primary))
        )
        assert conn.scalar(text("SHOW idle_in_transaction_session_timeout")) == "1s"
    engine.dispose()
    assert notices == []
