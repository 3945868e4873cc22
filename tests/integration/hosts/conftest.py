"""Several hosts on one machine (`netns.Network`): each runs its own worker in a network
namespace, with a home (scratch directory) no other host's worker uses, and reaches Postgres,
Redis and the S3 server (`moto`, tests/integration/storage) only over the bridge. Run the suite
alone with `-m hosts`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine, make_url

from api.main import create_app
from core.platform.settings import Settings
from tests.conftest import ProjectKey, make_project
from tests.integration.hosts.netns import Host, Network, require_namespaces
from tests.integration.s3server import S3, upload_corpus
from tests.integration.workers.conftest import worker_logs
from tests.integration.workers.helpers import Worker, start_worker

__all__ = ["worker_logs"]


@pytest.fixture(scope="module")
def network(settings: Settings, s3: S3) -> Iterator[Network]:
    """A bridge with Postgres, Redis and the S3 server exposed on its address; the hosts the
    module adds are deleted with it."""
    require_namespaces()
    net = Network()
    try:
        yield net
    finally:
        net.close()


@pytest.fixture(scope="module")
def services(network: Network, settings: Settings, s3: S3) -> dict[str, str]:
    """The URLs of Postgres, Redis and S3 as a host sees them: the bridge's address."""
    db = make_url(settings.database_url)
    broker = make_url(settings.broker_url)
    s3_port = int(s3.endpoint.rsplit(":", 1)[1])
    pg = network.expose(db.port or 5432)
    redis = network.expose(broker.port or 6379)
    return {
        "database_url": db.set(host=network.gateway, port=pg).render_as_string(hide_password=False),
        "broker_url": broker.set(host=network.gateway, port=redis).render_as_string(
            hide_password=False
        ),
        "s3_endpoint": f"http://{network.gateway}:{network.expose(s3_port)}",
    }


HostWorker = Callable[[Host, str], Worker]


@pytest.fixture
def host_worker(
    s3_settings: Settings,
    s3: S3,
    services: dict[str, str],
    celery_client: Celery,
    worker_logs: Path,
    tmp_path: Path,
) -> Iterator[HostWorker]:
    """`start(host, queue)`: a worker in `host`'s namespace on `queue`, with a home of its own,
    `TORCHYARD_ADVERTISE_HOST` its address and gloo on its `eth0`; stopped at the end."""
    started: list[Worker] = []

    def start(host: Host, queue: str) -> Worker:
        settings = s3_settings.model_copy(
            update={
                "home": tmp_path / host.ns,
                "database_url": services["database_url"],
                "broker_url": services["broker_url"],
                "advertise_host": host.address,
            }
        )
        env = {
            **s3.env,
            "FSSPEC_S3_ENDPOINT_URL": services["s3_endpoint"],
            "TORCHYARD_ADVERTISE_HOST": host.address,
            "GLOO_SOCKET_IFNAME": "eth0",
        }
        worker = start_worker(
            settings=settings,
            client=celery_client,
            queue=queue,
            log_dir=worker_logs,
            extra_env=env,
            name=f"{host.ns}@{host.address}",
            argv_prefix=host.argv([]),
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="module")
def api(s3_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(s3_settings), raise_server_exceptions=True) as client:
        yield client


@pytest.fixture(scope="module")
def uploaded(api: TestClient, engine: Engine, corpus_dir: Path) -> tuple[ProjectKey, str]:
    """A project of its own and a dataset uploaded to the bucket: (project, dataset id)."""
    project = make_project(engine)
    return project, upload_corpus(api, project, corpus_dir)
