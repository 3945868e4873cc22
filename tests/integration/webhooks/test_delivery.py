"""Webhook delivery end to end: real receivers on loopback, signatures checked with the
Standard Webhooks library, a receiver that is down for a while, retries driven by a clock."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select
from standardwebhooks.webhooks import WebhookVerificationError

from core.jobs import exports, upserts
from core.jobs import service as jobs
from core.platform.db import session_scope
from core.platform.settings import Settings
from core.platform.tables import (
    Checkpoint,
    CheckpointExport,
    JobState,
    WebhookDelivery,
    WebhookEvent,
)
from core.webhooks import delivery as webhook_delivery
from tests.conftest import ProjectKey
from tests.integration.webhooks.conftest import Clock, new_job, subscribe
from tests.integration.webhooks.receiver import Receiver

S = JobState


def _run_to_success(engine: Engine, job_id: int) -> None:
    with session_scope(engine) as s:
        assert jobs.claim(session=s, job_id=job_id, worker="w1") is not None
    with session_scope(engine) as s:
        jobs.transition(session=s, job_id=job_id, to=S.RUNNING)
    with session_scope(engine) as s:
        jobs.add_event(
            session=s,
            job=jobs.get_or_raise(session=s, job_id=job_id),
            kind="checkpoint",
            message="checkpoint at step 10",
            data={"step": 10, "uri": "/srv/x"},
        )
    with session_scope(engine) as s:
        jobs.transition(session=s, job_id=job_id, to=S.SUCCEEDED)


def test_every_state_change_of_a_job_arrives_signed_in_order(
    wh_client: TestClient, project: ProjectKey, engine: Engine, receiver: Receiver, clock: Clock
) -> None:
    hook = subscribe(wh_client, project, receiver.url, ["job.*", "checkpoint.saved"])
    job_id = new_job(engine, project)
    _run_to_success(engine, job_id)

    clock.deliver_until(lambda: len(receiver.unique()) == 5)

    bodies = [r.verify(hook["secret"]["secret"]) for r in receiver.received]
    assert [b["type"] for b in bodies] == [
        "job.queued",
        "job.starting",
        "job.running",
        "checkpoint.saved",
        "job.succeeded",
    ]
    assert {b["data"]["job"]["id"] for b in bodies} == {job_id}
    assert [b["sequence"] for b in bodies] == sorted(b["sequence"] for b in bodies)
    assert bodies[3]["data"]["data"] == {"step": 10}  # no server path leaves the server
    assert [r.webhook_id for r in receiver.received] == [b["id"] for b in bodies]


def test_no_server_directory_leaves_in_a_webhook_body(
    wh_client: TestClient,
    project: ProjectKey,
    engine: Engine,
    receiver: Receiver,
    clock: Clock,
    settings: Settings,
) -> None:
    """A state change's message and data may name a file under the storage root or the home
    (a failure's text, say): the receiver reads it relative to that root, as the API shows it."""
    hook = subscribe(wh_client, project, receiver.url, ["job.failed"])
    job_id = new_job(engine, project)
    storage, home = settings.storage_path, settings.home.resolve()
    with session_scope(engine) as s:
        assert jobs.claim(session=s, job_id=job_id, worker="w1") is not None
    with session_scope(engine) as s:
        jobs.transition(
            session=s,
            job_id=job_id,
            to=S.FAILED,
            message=f"cannot write {storage}/jobs/{job_id}/checkpoints/step_00000010: disk full",
            data={"log": f"{home}/runs/{job_id}/stderr.log", "step": 10},
        )

    clock.deliver_until(lambda: len(receiver.unique()) == 1)

    (body,) = [r.verify(hook["secret"]["secret"]) for r in receiver.received]
    assert body["data"]["message"] == (
        f"cannot write jobs/{job_id}/checkpoints/step_00000010: disk full"
    )
    assert body["data"]["data"] == {"log": f"runs/{job_id}/stderr.log", "step": 10}
    text = json.dumps(body)
    assert str(storage) not in text and str(home) not in text


def test_a_receiver_down_for_a_while_gets_exactly_the_events_that_happened(
    wh_client: TestClient, project: ProjectKey, engine: Engine, receiver: Receiver, clock: Clock
) -> None:
    hook = subscribe(wh_client, project, receiver.url, ["job.*"])
    receiver.stop()  # connections refused
    first = new_job(engine, project, "a")
    second = new_job(engine, project, "b")
    with session_scope(engine) as s:
        jobs.cancel(session=s, job_id=second)
    assert clock.deliver() >= 3
    clock.advance(webhook_delivery.RETRY_SCHEDULE_S[0])
    clock.deliver()  # refused again
    receiver.start()
    receiver.status = 500  # up, but failing
    clock.advance(webhook_delivery.RETRY_SCHEDULE_S[1])
    clock.deliver()
    _run_to_success(engine, first)  # more events while it is failing
    clock.deliver()
    assert receiver.unique() == {}
    receiver.status = 200

    clock.deliver_until(lambda: len(receiver.unique()) == 6)

    with session_scope(engine) as s:
        outbox = (
            s.execute(
                select(WebhookEvent.event_id)
                .where(WebhookEvent.project_id == project.project_id)
                .order_by(WebhookEvent.id)
            )
            .scalars()
            .all()
        )
    got = receiver.unique()
    assert set(got) == set(outbox)
    bodies = [got[event_id].verify(hook["secret"]["secret"]) for event_id in outbox]
    assert [(b["data"]["job"]["id"], b["type"]) for b in bodies] == [
        (first, "job.queued"),
        (second, "job.queued"),
        (second, "job.cancelled"),
        (first, "job.starting"),
        (first, "job.running"),
        (first, "job.succeeded"),
    ]
    log = wh_client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=project.headers).json()
    tries = {d["event_id"]: [a["status_code"] for a in d["log"]] for d in log["items"]}
    assert all(d["status"] == "delivered" for d in log["items"])
    assert [tries[event_id] for event_id in outbox] == [
        [None, None, 500, 200],
        [None, None, 500, 200],
        [None, None, 500, 200],
        [500, 200],
        [500, 200],
        [500, 200],
    ]


def _ping(client: TestClient, project: ProjectKey, hook_id: str) -> dict[str, object]:
    answer = client.post(f"/v1/webhooks/{hook_id}/ping", headers=project.headers)
    assert answer.status_code == 202, answer.text
    return dict(answer.json())


def test_during_rotation_each_secret_verifies_and_a_deleted_one_no_longer_does(
    wh_client: TestClient, project: ProjectKey, receiver: Receiver, clock: Clock
) -> None:
    hook = subscribe(wh_client, project, receiver.url, ["job.*"])
    old = hook["secret"]
    answer = wh_client.post(f"/v1/webhooks/{hook['id']}/secrets", headers=project.headers)
    assert answer.status_code == 201, answer.text
    new = answer.json()
    _ping(wh_client, project, hook["id"])
    clock.deliver_until(lambda: len(receiver.received) == 1)
    during = receiver.received[0]
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    assert during.verify(old["secret"])["type"] == "ping"
    assert during.verify(new["secret"])["type"] == "ping"

    gone = wh_client.delete(
        f"/v1/webhooks/{hook['id']}/secrets/{old['id']}", headers=project.headers
    )
    assert gone.status_code == 204, gone.text
    _ping(wh_client, project, hook["id"])
    clock.deliver_until(lambda: len(receiver.received) == 2)
    after = receiver.received[1]
    assert after.verify(new["secret"])["type"] == "ping"
    with pytest.raises(WebhookVerificationError):
        after.verify(old["secret"])
    last = wh_client.delete(
        f"/v1/webhooks/{hook['id']}/secrets/{new['id']}", headers=project.headers
    )
    assert last.status_code == 409, last.text


def test_ping_redeliver_and_the_delivery_log(
    wh_client: TestClient, project: ProjectKey, receiver: Receiver, clock: Clock
) -> None:
    hook = subscribe(wh_client, project, receiver.url, ["checkpoint.saved"])
    receiver.status = 503
    ping = _ping(wh_client, project, hook["id"])
    clock.deliver()
    receiver.status = 200
    clock.deliver_until(lambda: len(receiver.received) == 1)
    url = f"/v1/webhooks/{hook['id']}/deliveries"
    (delivery,) = wh_client.get(url, headers=project.headers).json()["items"]
    assert delivery["id"] == ping["id"] and delivery["event_type"] == "ping"
    assert delivery["status"] == "delivered" and delivery["delivered_at"] is not None
    assert [a["status_code"] for a in delivery["log"]] == [503, 200]
    assert all(a["response_ms"] > 0 for a in delivery["log"])
    assert delivery["last_status_code"] == 200 and delivery["last_error"] is None

    again = wh_client.post(f"{url}/{delivery['id']}/redeliver", headers=project.headers)
    assert again.status_code == 202, again.text
    assert again.json()["status"] == "pending"
    clock.deliver_until(lambda: len(receiver.received) == 2)
    first, second = receiver.received
    assert first.webhook_id == second.webhook_id == delivery["event_id"]
    (delivery,) = wh_client.get(url, headers=project.headers).json()["items"]
    assert [a["status_code"] for a in delivery["log"]] == [503, 200, 200]


def test_a_receiver_that_keeps_failing_is_given_up_after_the_last_retry(
    wh_client: TestClient, project: ProjectKey, receiver: Receiver, clock: Clock, engine: Engine
) -> None:
    hook = subscribe(wh_client, project, receiver.url, ["job.*"])
    receiver.status = 500
    ping = _ping(wh_client, project, hook["id"])
    with session_scope(engine) as s:

        def status() -> str:
            row = s.get(WebhookDelivery, ping["id"], populate_existing=True)
            assert row is not None
            return row.status

        clock.deliver_until(lambda: status() == "dead")
        row = s.get(WebhookDelivery, ping["id"])
        assert row is not None and row.attempts == webhook_delivery.MAX_ATTEMPTS
    assert receiver.received == []


def test_a_rolled_back_change_emits_nothing_and_a_committed_one_its_event(
    wh_client: TestClient, project: ProjectKey, engine: Engine, receiver: Receiver
) -> None:
    subscribe(wh_client, project, receiver.url, ["job.*"])
    job_id = new_job(engine, project)

    def outbox() -> list[str]:
        with session_scope(engine) as s:
            query = select(WebhookEvent.type).where(WebhookEvent.project_id == project.project_id)
            return list(s.scalars(query.order_by(WebhookEvent.id)))

    with session_scope(engine) as s:
        jobs.cancel(session=s, job_id=job_id)
        s.flush()
        assert outbox() == ["job.queued"]  # not visible outside the transaction yet
        s.rollback()
    assert outbox() == ["job.queued"]
    with session_scope(engine) as s:
        jobs.cancel(session=s, job_id=job_id)
    assert outbox() == ["job.queued", "job.cancelled"]
    with session_scope(engine) as s:
        pending = s.scalar(
            select(func.count())
            .select_from(WebhookDelivery)
            .join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)
            .where(WebhookEvent.project_id == project.project_id)
        )
    assert pending == 2


def test_a_destination_that_turned_private_is_refused_at_delivery(
    wh_client: TestClient, project: ProjectKey, receiver: Receiver, clock: Clock
) -> None:
    hook = subscribe(wh_client, project, receiver.url, ["job.*"])
    _ping(wh_client, project, hook["id"])
    clock.deliver(allow=[])  # the allow-list no longer permits loopback
    url = f"/v1/webhooks/{hook['id']}/deliveries"
    (delivery,) = wh_client.get(url, headers=project.headers).json()["items"]
    assert delivery["status"] == "pending" and delivery["last_status_code"] is None
    assert "refused" in delivery["last_error"] and "127.0.0.1" in delivery["last_error"]
    assert receiver.received == []


def test_a_finished_export_is_announced(
    wh_client: TestClient, project: ProjectKey, engine: Engine, receiver: Receiver, clock: Clock
) -> None:
    hook = subscribe(wh_client, project, receiver.url, ["export.ready"])
    job_id = new_job(engine, project)
    with session_scope(engine) as s:
        # A real checkpoint's id: export rows are unique per checkpoint id, and a made-up one
        # (the job's id, once) collided with another test's real checkpoint in the same database.
        upserts.checkpoint(
            session=s, job_id=job_id, attempt=1, step=10, uri="/srv/ckpt", size_bytes=10
        )
        checkpoint_id = s.scalars(
            select(Checkpoint.id).where(Checkpoint.job_id == job_id, Checkpoint.step == 10)
        ).one()
        export = CheckpointExport(
            job_id=job_id, checkpoint_id=checkpoint_id, step=10, source_uri="/srv/ckpt",
            uri="/srv/out",
        )  # fmt: skip
        s.add(export)
        s.flush()
        claimed = exports.claim(session=s, export_id=export.id, worker="w1")
        assert claimed is not None
        assert exports.finish(session=s, claimed=claimed, size_bytes=123, sha256="ab" * 32)

    clock.deliver_until(lambda: len(receiver.received) == 1)
    body = receiver.received[0].verify(hook["secret"]["secret"])
    assert body["type"] == "export.ready"
    assert body["data"]["job"]["id"] == job_id
    assert (body["data"]["step"], body["data"]["size_bytes"]) == (10, 123)
    assert "/srv" not in receiver.received[0].body.decode()


def test_concurrent_senders_claim_each_delivery_once(
    wh_client: TestClient, project: ProjectKey, engine: Engine, receiver: Receiver, clock: Clock
) -> None:
    subscribe(wh_client, project, receiver.url, ["job.*"])
    for i in range(12):
        new_job(engine, project, f"j{i}")
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: clock.deliver(), range(4)))

    ids = [r.webhook_id for r in receiver.received]
    assert len(ids) == 12 and len(set(ids)) == 12  # SKIP LOCKED: no delivery sent twice


def test_pause_resume_failure_retry_and_cancel_each_arrive(
    wh_client: TestClient, project: ProjectKey, engine: Engine, receiver: Receiver, clock: Clock
) -> None:
    hook = subscribe(wh_client, project, receiver.url, ["job.*"])
    job_id = new_job(engine, project)
    steps = [
        lambda s: jobs.claim(session=s, job_id=job_id, worker="w1"),
        lambda s: jobs.transition(session=s, job_id=job_id, to=S.RUNNING),
        lambda s: jobs.pause(session=s, job_id=job_id),
        lambda s: jobs.transition(session=s, job_id=job_id, to=S.PAUSED),
        lambda s: jobs.resume(session=s, job_id=job_id),
        lambda s: jobs.claim(session=s, job_id=job_id, worker="w2"),
        lambda s: jobs.transition(session=s, job_id=job_id, to=S.RUNNING),
        lambda s: jobs.transition(session=s, job_id=job_id, to=S.FAILED),
        lambda s: jobs.retry(session=s, job_id=job_id),
        lambda s: jobs.cancel(session=s, job_id=job_id),
    ]
    for step in steps:
        with session_scope(engine) as s:
            assert step(s) is not None

    clock.deliver_until(lambda: len(receiver.unique()) == 11)
    bodies = sorted(
        (r.verify(hook["secret"]["secret"]) for r in receiver.received),
        key=lambda b: b["sequence"],
    )
    assert [b["type"].removeprefix("job.") for b in bodies] == [
        "queued", "starting", "running", "pausing", "paused", "queued",
        "starting", "running", "failed", "queued", "cancelled",
    ]  # fmt: skip
    assert [b["data"]["state_from"] for b in bodies[1:]] == [
        b["data"]["state_to"] for b in bodies[:-1]
    ]
