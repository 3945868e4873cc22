"""Fixtures for the streams/metrics tests: the API fixtures, and a submitted job."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import ProjectKey
from tests.integration.api.conftest import client, dataset, job_spec, submit

__all__ = ["client", "dataset"]


@pytest.fixture
def job(client: TestClient, project: ProjectKey, dataset: dict[str, Any]) -> dict[str, Any]:
    """A queued job of `project` (nothing runs it: tests write its reports themselves)."""
    return submit(client, project, job_spec(dataset["id"]))
