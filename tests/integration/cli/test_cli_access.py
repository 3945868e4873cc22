"""``torchyard members`` and ``torchyard keys`` against a real API server: an admin adds a
member, gives them a scoped key (its secret printed once), and revoking it locks it out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from torchyard import Client
from torchyard.cli import app
from torchyard.errors import PermissionDenied, Unauthorized


@pytest.fixture
def cli(live_api: str, api_key: str, tmp_path: Path) -> Any:
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        env = {
            "TORCHYARD_URL": live_api,
            "TORCHYARD_API_KEY": api_key,
            "TORCHYARD_CONFIG": str(tmp_path / "no-config.toml"),
        }
        return runner.invoke(app, list(args), env=env)

    return invoke


def test_an_admin_adds_a_member_gives_a_scoped_key_and_revokes_it(cli: Any, live_api: str) -> None:
    added = cli("members", "add", "ada@example.com", "--role", "viewer")
    assert added.exit_code == 0, added.output
    member_id = added.stdout.split()[1]
    listed = json.loads(cli("members", "list", "--json").stdout)
    assert [(m["id"], m["subject"], m["role"]) for m in listed] == [
        (member_id, "ada@example.com", "viewer")
    ]

    created = cli("keys", "create", "ada-laptop", "--member", member_id, "--scope", "jobs:read")
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip()
    assert secret.startswith("ty_")
    with Client(live_api, secret) as ada:
        assert ada.me().project.id  # reads work
        assert ada.jobs.list().items == []
        with pytest.raises(PermissionDenied):
            ada.keys.list()  # a viewer is no admin

    keys = json.loads(cli("keys", "list", "--json").stdout)
    mine = next(k for k in keys if k["name"] == "ada-laptop")
    assert mine["owner"]["id"] == member_id and mine["scopes"] == ["jobs:read"]
    assert secret not in json.dumps(keys) and mine["last_used_at"] is not None

    assert cli("keys", "revoke", mine["id"]).exit_code == 0
    with Client(live_api, secret) as ada, pytest.raises(Unauthorized):
        ada.me()
    removed = cli("members", "remove", member_id)
    assert removed.exit_code == 0, removed.output
    assert json.loads(cli("members", "list", "--json").stdout) == []


def test_scopes_beyond_the_owners_role_are_refused_with_the_field(cli: Any) -> None:
    member_id = cli("members", "add", "bob@example.com", "--role", "viewer").stdout.split()[1]
    refused = cli("keys", "create", "bob", "--member", member_id, "--scope", "jobs:write")
    assert refused.exit_code == 1
    assert "scopes" in refused.output and "viewer" in refused.output
