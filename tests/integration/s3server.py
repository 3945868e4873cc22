"""A real S3 API server for the storage and multi-host suites: `moto` in server mode on a
loopback port, one bucket per test session, reached through the same `s3fs`/fsspec path
production uses. The fixtures are registered once, in tests/integration/conftest.py: a second
registration would start a second server and point this process's fsspec at it.

Processes the tests start (workers, the exporter, uvicorn) get the S3 settings as production
does, in their environment (`s3_env`: the AWS credentials and `FSSPEC_S3_ENDPOINT_URL`, as in
docker-compose.yml); this process gets them in fsspec's configuration for `s3`, which only
`s3://` URLs read. Run the suite alone with `-m s3`.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import fsspec
import httpx
import pytest
from fastapi.testclient import TestClient

from core.platform.settings import Settings
from tests.conftest import ProjectKey, settings_env
from tests.integration.workers.helpers import wait_for
from workers.launcher import free_port

START_S = 60.0  # moto's imports on a loaded host


@dataclass(frozen=True)
class S3:
    """The S3 server and the credentials every process uses for it."""

    endpoint: str
    key: str
    secret: str
    bucket: str

    @property
    def env(self) -> dict[str, str]:
        """The variables a production worker or API host sets for S3 storage."""
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "FSSPEC_S3_ENDPOINT_URL": self.endpoint,
        }


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """A moto S3 server on a free loopback port with one new bucket; stopped at the end."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = S3(
        endpoint=f"http://127.0.0.1:{port}",
        key=f"AKIA{secrets.token_hex(8).upper()}",
        secret=f"s3-secret-{secrets.token_hex(16)}",  # unique: searched for in every answer
        bucket=f"torchyard-test-{secrets.token_hex(4)}",
    )

    def answers() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"moto exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            return httpx.get(f"{server.endpoint}/moto-api/", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    previous = fsspec.config.conf.get("s3")
    try:
        wait_for("the S3 server to answer", answers, START_S, 0.1)
        fsspec.config.conf["s3"] = {
            "endpoint_url": server.endpoint,
            "key": server.key,
            "secret": server.secret,
        }
        fsspec.filesystem("s3").mkdir(server.bucket)
        yield server
    finally:
        if previous is None:
            fsspec.config.conf.pop("s3", None)
        else:
            fsspec.config.conf["s3"] = previous
        fsspec.filesystem("s3").clear_instance_cache()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def s3_settings(settings: Settings, s3: S3) -> Settings:
    """The suite's settings with storage under a prefix of its own in the bucket."""
    root = f"s3://{s3.bucket}/{secrets.token_hex(4)}"
    return settings.model_copy(update={"storage_url": root})


@pytest.fixture(scope="module")
def s3_env(s3_settings: Settings, s3: S3) -> dict[str, str]:
    """The environment of a process (worker, exporter, API) on `s3_settings`."""
    return {**settings_env(s3_settings), **s3.env}


def s3_fs() -> fsspec.AbstractFileSystem:
    """This process's client of the S3 server (the `s3` fixture configured it)."""
    return fsspec.filesystem("s3")


def under(uri: str) -> str:
    """`s3://bucket/key` -> `bucket/key`, as s3fs's methods take it."""
    return uri.removeprefix("s3://")


def keys(prefix_uri: str) -> list[str]:
    """Every object under `prefix_uri`, as `s3://` URIs, sorted."""
    return sorted(f"s3://{k}" for k in s3_fs().find(under(prefix_uri)))


def local_text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def upload_corpus(api: TestClient, project: ProjectKey, corpus_dir: Path) -> str:
    """Upload the session corpus's first file as dataset `corpus` of `project` through `api`
    (to the bucket when `api` serves S3 settings); returns its id."""
    corpus = sorted(corpus_dir.glob("*.py"))[0]
    answer = api.post(
        "/v1/datasets/upload",
        files={"file": (corpus.name, corpus.read_bytes())},
        data={"name": "corpus"},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])
