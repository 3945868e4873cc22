"""The embedded default (SQLite) emits, claims and delivers as Postgres does."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from core.access import auth
from core.jobs import alerts
from core.jobs import service as jobs
from core.platform.db import make_engine, session_factory, session_scope, upgrade
from core.platform.server_paths import ServerPaths
from core.platform.tables import utcnow
from core.webhooks import delivery as webhook_delivery
from core.webhooks import subscriptions as webhooks
from jobspec.job import parse_job_spec
from tests.integration.webhooks.conftest import LOOPBACK
from tests.integration.webhooks.receiver import Receiver


def test_outbox_delivery_and_alerts_work_on_sqlite(tmp_path: Path, receiver: Receiver) -> None:
    url = f"sqlite:///{tmp_path / 'torchyard.db'}"
    upgrade(url)
    engine = make_engine(url)
    paths = ServerPaths((str(tmp_path),))

    def deliver() -> int:
        return webhook_delivery.deliver_due(
            session_factory=session_factory(engine), allow=LOOPBACK, paths=paths
        )

    try:
        with session_scope(engine) as s:
            project = auth.create_project(session=s, name="embedded")
            hook = webhooks.create(
                session=s,
                project_id=project.id,
                url=receiver.url,
                event_types=["job.*", "alert.*"],
                allow=LOOPBACK,
                alert_rules={"queued_minutes": 1},
            )
            secret = hook.secrets[0]["secret"]
        spec = parse_job_spec({"name": "t", "data": {"dataset": "d"}, "train": {"max_steps": 200}})
        with session_factory(engine)() as s:
            job_id = jobs.create(session=s, project_id=project.id, spec=spec).job.id
        for _ in range(2):  # fires once
            with session_scope(engine) as s:
                alerts.check_periodic(session=s, now=utcnow() + timedelta(minutes=2))

        sent = deliver()

        assert sent == 2
        bodies = [r.verify(secret) for r in receiver.received]
        assert sorted(b["type"] for b in bodies) == ["alert.queued_too_long", "job.queued"]
        assert {b["data"]["job"]["id"] for b in bodies} == {job_id}
        assert deliver() == 0
    finally:
        engine.dispose()
