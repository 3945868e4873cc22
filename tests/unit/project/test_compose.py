"""docker-compose.yml describes the production layout of README.md: the services exist, share
one configuration, the worker reserves GPUs, and the image can reach the S3 storage it names."""

from __future__ import annotations

import tomllib
from typing import Any

import yaml

from tests.conftest import REPO_ROOT


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text()))


def test_the_production_services_are_all_there_and_share_one_configuration() -> None:
    services = _compose()["services"]
    ours_names = ("migrate", "api", "worker", "exporter", "controller")
    assert {"postgres", "redis", "minio", *ours_names} <= set(services)
    ours = [services[name] for name in ours_names]
    assert all(s["environment"] == ours[0]["environment"] for s in ours)
    env = ours[0]["environment"]
    assert env["TORCHYARD_ENV"] == "production"
    assert env["TORCHYARD_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["TORCHYARD_BROKER_URL"].startswith("redis://")
    for name in ("api", "worker", "controller"):
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }, name


def test_two_controllers_run_so_that_one_stands_by() -> None:
    controller = _compose()["services"]["controller"]
    assert controller["command"] == ["torchyard", "controller"]
    assert controller["deploy"]["replicas"] == 2


def test_the_worker_reserves_the_hosts_gpus() -> None:
    worker = _compose()["services"]["worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert worker["command"][:2] == ["torchyard", "worker"]


def test_an_s3_storage_url_comes_with_the_s3_filesystem_in_the_image() -> None:
    env = _compose()["services"]["api"]["environment"]
    assert env["TORCHYARD_STORAGE_URL"].startswith("s3://")
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(dep.startswith("s3fs") for dep in extras["s3"])
    assert 'pip install -e ".[all,s3]"' in (REPO_ROOT / "Dockerfile").read_text()


def test_the_services_reach_postgres_through_pgbouncer_and_the_controller_directly() -> None:
    """Transaction pooling for the many clients (API, workers); Postgres itself for what needs a
    session of its own (the controller's leader lock, migrations: Settings.database_direct_url)."""
    services = _compose()["services"]
    pooler = services["pgbouncer"]["environment"]
    assert pooler["POOL_MODE"] == "transaction"
    assert pooler["DATABASE_URL"].split("@")[1] == "postgres:5432/torchyard"
    env = services["api"]["environment"]
    assert "@pgbouncer:6432/" in env["TORCHYARD_DATABASE_URL"]
    assert "@postgres:5432/" in env["TORCHYARD_DATABASE_DIRECT_URL"]
    for name in ("api", "worker", "exporter"):
        assert services[name]["depends_on"]["pgbouncer"] == {"condition": "service_healthy"}
