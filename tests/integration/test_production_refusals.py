"""`TORCHYARD_ENV=production` refuses the embedded defaults (issue 44): the API server and a
Celery worker started on SQLite, or on the server-less broker, exit at once naming the setting;
a worker that cannot sandbox refuses too (tests/integration/workers/test_sandbox.py). Real
processes, bounded in time; nothing listens for long enough to serve a request."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.platform.settings import Settings
from tests.conftest import REPO_ROOT
from workers.launcher import free_port

TIMEOUT_S = 120


def _env(tmp_path: Path, **values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    return {
        **env,
        "PYTHONPATH": str(REPO_ROOT),
        "TORCHYARD_ENV": "production",
        "TORCHYARD_HOME": str(tmp_path / "home"),
        **values,
    }


API = [sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory", "--host", "127.0.0.1"]
WORKER = [sys.executable, "-m", "celery", "-A", "workers.app:app", "worker", "--pool", "solo"]


@pytest.mark.parametrize("command", [API, WORKER], ids=["api", "worker"])
@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("TORCHYARD_DATABASE_URL", "TORCHYARD_DATABASE_URL: production needs Postgres, not SQLite"),
        ("TORCHYARD_BROKER_URL", "TORCHYARD_BROKER_URL: production needs Redis, not filesystem://"),
    ],
    ids=["sqlite", "filesystem-broker"],
)
def test_production_refuses_the_embedded_defaults_at_start(
    command: list[str], setting: str, says: str, settings: Settings, tmp_path: Path
) -> None:
    """Only the setting named is left at its embedded default; the process exits non-zero
    before serving, and its output names the setting and what production needs."""
    good = {
        "TORCHYARD_DATABASE_URL": settings.database_url,
        "TORCHYARD_BROKER_URL": settings.broker_url,
    }
    del good[setting]  # the embedded default: SQLite under home, or filesystem://
    argv = [*command, "--port", str(free_port())] if command is API else command
    done = subprocess.run(
        argv,
        cwd=REPO_ROOT,
        env=_env(tmp_path, **good),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode != 0
    assert says in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
