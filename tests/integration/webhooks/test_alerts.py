"""Alerts: reported through the real ingest path (events.jsonl -> RunIngest.flush) and the
periodic check, delivered to a real receiver; each fires once per condition."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from core.jobs import alerts
from core.jobs import service as jobs
from core.platform.db import session_factory, session_scope
from core.platform.tables import JobState, utcnow
from tests.conftest import ProjectKey
from tests.integration.webhooks.conftest import Clock, new_job, subscribe
from tests.integration.webhooks.receiver import Receiver
from workers.ingest import RunIngest
from workers.launcher import RunPaths


def _metric(step: int, **values: float) -> bytes:
    return json.dumps({"type": "metric", "step": step, "time": 1.0, "values": values}).encode()


def _alerts(receiver: Receiver, secret: str) -> list[tuple[str, int | None]]:
    bodies = [r.verify(secret) for r in receiver.unique().values()]
    return sorted((b["type"], b["data"].get("step")) for b in bodies)


def test_metric_alerts_fire_once_per_condition_from_ingest(
    wh_client: TestClient,
    project: ProjectKey,
    engine: Engine,
    receiver: Receiver,
    clock: Clock,
    tmp_path: Path,
) -> None:
    rules = {
        "nan_loss": True,
        "loss_spike_factor": 3.0,
        "loss_spike_window": 3,
        "eval_regression_margin": 0.2,
    }
    hook = subscribe(wh_client, project, receiver.url, ["alert.*"], alert_rules=rules)
    quiet = subscribe(wh_client, project, receiver.url, ["alert.*"])  # no rules: no alerts
    job_id = new_job(engine, project)
    with session_scope(engine) as s:
        assert jobs.claim(session=s, job_id=job_id, worker="w1") is not None
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    ingest = RunIngest(paths=paths, job_id=job_id, attempt=1)
    factory = session_factory(engine)
    chunks = [
        [_metric(s, loss=1.0) for s in (1, 2, 3, 4)] + [_metric(5, eval_loss=2.0)],
        [_metric(6, loss=10.0), _metric(7, loss=40.0)],  # one spike, two points
        [_metric(8, loss=float("nan")), _metric(9, loss=float("inf"))],
        [_metric(10, eval_loss=1.5), _metric(15, eval_loss=1.9), _metric(20, eval_loss=2.0)],
        [_metric(s, loss=1.0) for s in range(11, 16)],  # back to normal: the spike clears
        [_metric(16, loss=5.0)],  # a new spike episode
    ]
    with paths.events.open("ab") as events:
        for chunk in chunks:
            events.write(b"\n".join(chunk) + b"\n")
            events.flush()
            ingest.flush(factory)

    clock.deliver_until(lambda: len(receiver.unique()) == 4)
    assert _alerts(receiver, hook["secret"]["secret"]) == [
        ("alert.eval_regression", 15),
        ("alert.loss_spike", 6),
        ("alert.loss_spike", 16),
        ("alert.nan_loss", 8),
    ]
    deliveries = wh_client.get(
        f"/v1/webhooks/{quiet['id']}/deliveries", headers=project.headers
    ).json()["items"]
    assert deliveries == []


def test_queued_and_stalled_alerts_fire_once_from_the_periodic_check(
    wh_client: TestClient, project: ProjectKey, engine: Engine, receiver: Receiver, clock: Clock
) -> None:
    rules = {"queued_minutes": 10, "stalled_minutes": 30}
    hook = subscribe(wh_client, project, receiver.url, ["alert.*"], alert_rules=rules)
    waiting = new_job(engine, project, "waiting")
    running = new_job(engine, project, "running")
    with session_scope(engine) as s:
        assert jobs.claim(session=s, job_id=running, worker="w1") is not None
        jobs.transition(session=s, job_id=running, to=JobState.RUNNING)
    now = utcnow()
    for minutes in (5, 11, 12, 31, 32):
        with session_scope(engine) as s:
            alerts.check_periodic(session=s, now=now + timedelta(minutes=minutes))

    clock.deliver_until(lambda: len(receiver.unique()) == 2)
    bodies = [r.verify(hook["secret"]["secret"]) for r in receiver.unique().values()]
    assert sorted((b["type"], b["data"]["job"]["id"]) for b in bodies) == sorted(
        [("alert.queued_too_long", waiting), ("alert.stalled", running)]
    )
