"""A rerun of `torchyard quickstart` replaces its organisation admin key (issue 45, item 9):
each run added one more never-expiring `bootstrap` key to the home's database. The real path:
`torchyard.quickstart.bootstrap` runs `core.admin migrate` and `bootstrap` as subprocesses."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from core.access import auth
from core.platform.db import session_scope
from core.platform.errors import Unauthorized
from core.platform.settings import Settings
from core.platform.tables import ApiKey
from tests.conftest import settings_env
from torchyard.quickstart import bootstrap


def _keys(engine: Engine, project: str) -> list[tuple[str, bool, bool]]:
    """(name, org admin, revoked) of the project's keys, oldest first."""
    with session_scope(engine) as s:
        found = auth.get_project_by_name(session=s, name=project)
        assert found is not None
        rows = s.scalars(
            select(ApiKey).where(ApiKey.project_id == found.id).order_by(ApiKey.created_at)
        )
        return [(k.name, k.org_admin, k.revoked_at is not None) for k in rows]


def test_a_quickstart_rerun_replaces_its_bootstrap_key_instead_of_adding_one(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    project = f"qs-{secrets.token_hex(4)}"
    env, log = settings_env(settings), tmp_path / "admin.log"
    first = bootstrap(env, log, project)
    second = bootstrap(env, log, project)
    third = bootstrap(env, log, project)
    assert len({first, second, third}) == 3
    assert _keys(engine, project) == [
        ("bootstrap", True, True),
        ("bootstrap", True, True),
        ("bootstrap", True, False),
    ]
    with session_scope(engine) as s:
        assert auth.authenticate(session=s, secret=third).org_admin
        for old in (first, second):
            with pytest.raises(Unauthorized):
                auth.authenticate(session=s, secret=old)


def test_replacing_leaves_other_projects_and_other_names_alone(engine: Engine) -> None:
    with session_scope(engine) as s:
        mine = auth.create_project(session=s, name=f"qs-{secrets.token_hex(4)}")
        other = auth.create_project(session=s, name=f"qs-{secrets.token_hex(4)}")
        ci = auth.create_api_key(session=s, project_id=mine.id, name="ci", org_admin=True)
        theirs = auth.create_api_key(
            session=s, project_id=other.id, name="bootstrap", org_admin=True
        )
        auth.create_api_key(session=s, project_id=mine.id, name="bootstrap", org_admin=True)
        auth.replace_org_admin_key(session=s, project_id=mine.id, name="bootstrap")
    with session_scope(engine) as s:
        for kept in (ci, theirs):
            assert auth.authenticate(session=s, secret=kept).org_admin
    assert _keys(engine, mine.name) == [
        ("ci", True, False),
        ("bootstrap", True, True),
        ("bootstrap", True, False),
    ]
