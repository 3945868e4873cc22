"""0015_identity keeps keys made before it working exactly as before: owner-less admins with
every scope; and downgrading removes what it added."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from core.access import auth
from core.platform.db import alembic_config, make_engine
from core.platform.models import utcnow
from tests.conftest import PG_ADMIN_URL


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a new, empty database of each backend, dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'torchyard.db'}"
        return
    name = f"torchyard_mig_{secrets.token_hex(4)}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_keys_made_before_0015_stay_admins_with_every_scope(empty_database: str) -> None:
    url = empty_database
    config = alembic_config(url)
    command.upgrade(config, "0014_quotas")
    engine = make_engine(url)
    secret = "ty_made-before-roles"
    try:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO projects (id, name, created_at) VALUES ('prj_1', 'old', :t)"),
                {"t": utcnow()},
            )
            conn.execute(
                text(
                    "INSERT INTO api_keys (id, project_id, name, prefix, key_hash, created_at)"
                    " VALUES ('key_1', 'prj_1', 'old', 'ty_made-be', :h, :t)"
                ),
                {"h": auth.hash_key(secret), "t": utcnow()},
            )
        command.upgrade(config, "0015_identity")
        with Session(engine) as session:
            principal = auth.authenticate(session=session, secret=secret)
        assert principal.role == auth.Role.ADMIN and principal.scopes == auth.ALL_SCOPES
        assert not principal.org_admin
        command.downgrade(config, "0014_quotas")
        tables = set(inspect(engine).get_table_names())
        assert not {"project_members", "service_accounts"} & tables
        columns = {c["name"] for c in inspect(engine).get_columns("api_keys")}
        assert columns == {"id", "project_id", "name", "prefix", "key_hash", "created_at",
                           "revoked_at"}  # fmt: skip
    finally:
        engine.dispose()
