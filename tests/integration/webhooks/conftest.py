"""Fixtures for the webhook tests: an app that allows loopback receivers and a `deliver` that
drives `deliver_due` at a chosen time instead of sleeping (the `receiver` on loopback is
tests/integration/conftest.py's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from core.jobs import service as jobs
from core.platform.db import session_factory
from core.platform.server_paths import ServerPaths
from core.platform.settings import Settings
from core.platform.tables import utcnow
from core.webhooks import delivery as webhook_delivery
from jobspec.job import parse_job_spec
from tests.conftest import ProjectKey

LOOPBACK = ["127.0.0.1/32"]


@pytest.fixture(scope="module")
def wh_client(settings: Settings) -> Iterator[TestClient]:
    """The API with loopback receivers allowed (`TORCHYARD_WEBHOOK_ALLOW=127.0.0.1/32`)."""
    allowed = settings.model_copy(update={"webhook_allow": LOOPBACK})
    with TestClient(create_app(allowed), raise_server_exceptions=True) as client:
        yield client


class Clock:
    """Drives `deliver_due` at `now`, which only moves forward when a test says so."""

    def __init__(self, engine: Engine, paths: ServerPaths) -> None:
        self.offset = timedelta(0)
        self.sessions = session_factory(engine)
        self.paths = paths

    @property
    def now(self) -> datetime:
        return utcnow() + self.offset

    def deliver(self, allow: list[str] | None = None) -> int:
        return webhook_delivery.deliver_due(
            session_factory=self.sessions,
            allow=LOOPBACK if allow is None else allow,
            paths=self.paths,
            timeout_s=5.0,
            now=self.now,
        )

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)

    def deliver_until(self, done: Callable[[], bool], rounds: int = 30) -> None:
        """Deliver, moving the clock past the longest retry wait each round, until `done`."""
        for _ in range(rounds):
            self.deliver()
            if done():
                return
            self.advance(max(webhook_delivery.RETRY_SCHEDULE_S) + 1)
        raise AssertionError("deliveries did not complete")


@pytest.fixture
def clock(engine: Engine, settings: Settings) -> Clock:
    return Clock(engine, ServerPaths.of(settings))


def new_job(engine: Engine, project: ProjectKey, name: str = "tiny") -> int:
    """A queued job of `project` (made by the service, no broker message)."""
    spec = parse_job_spec(
        {"name": name, "data": {"dataset": "ds_none"}, "train": {"max_steps": 200}}
    )
    with session_factory(engine)() as session:
        return jobs.create(session=session, project_id=project.project_id, spec=spec).job.id


def subscribe(
    client: TestClient, project: ProjectKey, url: str, event_types: list[str], **extra: Any
) -> dict[str, Any]:
    answer = client.post(
        "/v1/webhooks",
        json={"url": url, "event_types": event_types, **extra},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    return dict(answer.json())
