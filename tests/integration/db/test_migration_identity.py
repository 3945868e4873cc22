"""0015_identity keeps keys made before it working exactly as before: owner-less admins with
every scope; and downgrading removes what it added."""

from __future__ import annotations

from alembic import command
from sqlalchemy import inspect, text
from sqlalchemy.orm import Session

from core.access import auth
from core.platform.db import alembic_config, make_engine
from core.platform.tables import utcnow


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
