"""Fixtures for tests against a running API: a real uvicorn server on a free port.

`live_api` (session-scoped) is the server's base URL; `api_key` a fresh project's API key;
`celery_client` a Celery client on the test broker, for tests that start real workers;
`receiver` a real webhook receiver on loopback.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery
from typer.testing import CliRunner, Result

from core.platform.queue import celery_config
from core.platform.settings import Settings
from tests.conftest import REPO_ROOT, ProjectKey, settings_env
from tests.integration.s3server import s3, s3_env, s3_settings
from tests.integration.webhooks.receiver import Receiver
from tests.integration.workers.controllers import Controller
from tests.integration.workers.helpers import Worker

__all__ = ["s3", "s3_env", "s3_settings"]  # fixtures (tests/integration/s3server.py)
from torchyard.cli import app
from workers.launcher import free_port

# A bounded wait, not a speed claim: a CI host running four test processes, trainers and
# Chromium once kept a uvicorn in its startup for over 60 s.
_START_TIMEOUT_S = 180.0


def wait_until_ready(
    base_url: str, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float
) -> None:
    """Poll `/readyz` until 200; fail with the server's log if it exits or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"API server exited with {proc.returncode} before it was ready; log:\n"
                + log_path.read_text(errors="replace")
            )
        try:
            answer = httpx.get(f"{base_url}/readyz", timeout=2.0)
            if answer.status_code == 200:
                return
            last = f"{answer.status_code} {answer.text}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.1)
    pytest.fail(
        f"API server not ready after {timeout_s:.0f}s ({last}); log:\n"
        + log_path.read_text(errors="replace")
    )


@contextlib.contextmanager
def serve_api(env: dict[str, str], log_dir: Path) -> Iterator[str]:
    """`uvicorn api.main:create_app --factory` on a free loopback port with environment `env`:
    its base URL once `/readyz` answers; terminated (then killed) on exit. Its log is
    `log_dir/uvicorn.log`, shown when it fails to start."""
    port = free_port()
    log_path = log_dir / "uvicorn.log"
    command = [
        sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=log)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url, proc, log_path, _START_TIMEOUT_S)
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def live_api(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of `uvicorn api.main:create_app --factory` serving `settings`."""
    with serve_api(settings_env(settings), tmp_path_factory.mktemp("live_api")) as base_url:
        yield base_url


@pytest.fixture
def api_key(project: ProjectKey) -> str:
    """The API key of a fresh project (the `project` fixture)."""
    return project.api_key


UNSERVED_POOL = "cli-test-unserved"


def cli_invoker(base_url: str, api_key: str, tmp_path: Path, **env: str) -> Any:
    """`invoke(*args, key=None) -> Result`: the `torchyard` CLI in this process against
    `base_url` with `api_key` (or `key`), no saved login, and any further environment `env`."""
    runner = CliRunner()

    def invoke(*args: str, key: str | None = None) -> Result:
        full = {
            "TORCHYARD_URL": base_url,
            "TORCHYARD_API_KEY": key or api_key,
            "TORCHYARD_CONFIG": str(tmp_path / "no-config.toml"),
            **env,
        }
        return runner.invoke(app, list(args), env=full)

    return invoke


@pytest.fixture
def cli(live_api: str, api_key: str, tmp_path: Path) -> Any:
    """`cli(*args, key=None) -> Result`: the `torchyard` CLI in this process against `live_api`
    with the project's key (or `key`), and no saved login."""
    return cli_invoker(live_api, api_key, tmp_path)


@pytest.fixture
def spec_file(tmp_path: Path, cli: Any, corpus_dir: Path) -> Path:
    """A YAML spec of a tiny job on a pool no worker serves (`UNSERVED_POOL`: it stays queued
    until the test ends it), whose data is a corpus file uploaded through the CLI."""
    corpus_file = sorted(corpus_dir.glob("*.py"))[0]
    uploaded = cli("datasets", "upload", "corpus", str(corpus_file), "--json")
    assert uploaded.exit_code == 0, uploaded.output
    dataset = json.loads(uploaded.stdout)
    assert dataset["size_bytes"] == corpus_file.stat().st_size
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: cli-test\n"
        "model: {n_layers: 1, d_model: 32, n_heads: 2, seq_len: 16}\n"
        f"data: {{dataset: {dataset['id']}}}\n"
        "train: {max_steps: 10}\n"
        "eval: {interval_steps: 5}\n"
        f"resources: {{pool: {UNSERVED_POOL}, procs_per_node: 1}}\n"
        "parallelism: {strategy: single}\n"
    )
    return path


@pytest.fixture(scope="session")
def celery_client(settings: Settings) -> Iterator[Celery]:
    """A Celery client on the test broker, as the API has one."""
    app = Celery("torchyard-tests")
    app.conf.update(celery_config(settings))
    yield app
    app.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver on a free loopback port (tests/integration/webhooks/receiver.py)."""
    found = Receiver()
    yield found
    found.stop()


@pytest.fixture
def fleet() -> Iterator[list[Worker]]:
    """The workers a test starts; each is stopped (or already dead) at the end. A worker left
    running consumes its pool's and the control queue's messages for later tests of the same
    broker database (the reconciler's among them), or for another run's."""
    holder: list[Worker] = []
    yield holder
    for w in holder:
        w.stop()


@pytest.fixture
def controllers() -> Iterator[list[Controller]]:
    """The controllers a test starts (`start_controller`); each is stopped (or already dead) at
    the end."""
    started: list[Controller] = []
    yield started
    for c in started:
        c.stop()
