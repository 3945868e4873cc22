"""Issue 14's "Done means" as one story, over REST with each role's key, on real Celery workers
(a pool worker of 2 CPU slots, and a control worker with Celery beat whose reconciler
preempts), real torchrun, Postgres and Redis, and a real webhook receiver on loopback. The jobs
are the member's uploaded `STEPS_PY` program (`tests.integration.workers.archives`): the story
is about the control plane, which a job that trains nothing exercises as a training one does
(the built-in trainer's preemption is `tests/integration/faults/test_preemption.py`'s).

An organisation admin creates a project; its admin invites a viewer and a member, gives a CI
service account a `jobs:write` key, caps the project at 2 slots (GPUs) on the pool and
subscribes a webhook. The member's two jobs fill the cap and its third waits with `quota gpus
2/2` and an estimated start. CI's job of higher priority preempts the member's lowest one,
which checkpoints, yields, and later resumes from that checkpoint without losing or repeating
a step. The receiver gets every job event, signed, and exactly the ones that happened; usage
shows the slot-seconds (GPU-seconds) of each job; the viewer reads all of it, and every change
it tries is refused (403) and changes nothing.

The member's two running jobs train until it cancels them: a job that could end on its own
might end before the reconciler's next round (every 2 s), and then nothing would be preempted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from core.platform.settings import Settings
from core.platform.tables import utcnow
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, submit
from tests.integration.org_roles import Cast, created, set_up_project
from tests.integration.webhooks.conftest import LOOPBACK, subscribe
from tests.integration.webhooks.receiver import Receiver
from tests.integration.workers.archives import STEPS_PY, UNTIL_STOPPED, steps_spec, tar_gz
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    log_tails,
    start_worker,
    unique_queue,
    wait_for,
    wait_state,
    wait_step,
)
from workers.app import CONTROL_QUEUE

TIMEOUT_S = 120.0
CHECKPOINT_EVERY = 5  # steps, of the job that is preempted
STEP_S = 0.05  # seconds a step of the story's jobs


@pytest.fixture
def pool() -> str:
    return unique_queue("story")


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """A client of the API as deployed for the story: loopback receivers allowed, and the
    delivery loop of its lifespan sending webhooks every 0.1 s."""
    served = settings.model_copy(
        update={
            "webhook_allow": LOOPBACK,
            "webhook_deliver_in_api": True,
            "webhook_deliver_interval_s": 0.1,
        }
    )
    with TestClient(create_app(served), raise_server_exceptions=True) as answering:
        yield answering


@pytest.fixture
def pool_worker(
    settings: Settings, celery_client: Celery, worker_logs: Path, pool: str
) -> Iterator[Worker]:
    """A worker of 2 CPU slots on `pool`, and a control worker with Celery beat whose
    reconciler (every 2 s) preempts on `pool` (`TORCHYARD_PREEMPTION_POOLS`) with no minimum
    run time. Both have the same settings, as a deployment's processes do."""
    env = {"TORCHYARD_PREEMPTION_POOLS": pool, "TORCHYARD_PREEMPTION_MIN_RUN_S": "0"}
    started: list[Worker] = []
    try:
        for queue, slots, beat in ((pool, 2, False), (CONTROL_QUEUE, None, True)):
            started.append(
                start_worker(
                    settings=settings,
                    client=celery_client,
                    queue=queue,
                    log_dir=worker_logs,
                    extra_env=env,
                    slots=slots,
                    beat=beat,
                )
            )
        yield started[0]
    finally:
        for worker in started:
            worker.stop()


@dataclass(frozen=True)
class Story:
    """What the story made: the cast, the pool, the webhook, the member's code archive
    (`STEPS_PY`), and the jobs: the member's `low`
    (priority 0, preempted) and `kept` (priority 10), which train until the member cancels
    them, and `third` (waits on the quota); CI's `urgent` (priority 50)."""

    cast: Cast
    pool: str
    hook: dict[str, Any]
    code: str
    low: int = 0
    kept: int = 0
    third: int = 0
    urgent: int = 0

    @property
    def jobs(self) -> tuple[int, ...]:
        return (self.low, self.kept, self.third, self.urgent)


def _spec(
    pool: str, code: str, *, priority: int, steps: int, checkpoint_every: int = 0
) -> dict[str, Any]:
    """A `STEPS_PY` job of one slot on `pool` that takes `steps` steps and checkpoints every
    `checkpoint_every` (0: only when stopped), as JSON."""
    spec = steps_spec(
        code,
        pool=pool,
        steps=steps,
        checkpoint_every=checkpoint_every,
        step_s=STEP_S,
        priority=priority,
    )
    return spec.model_dump(mode="json", exclude_unset=True)


def _get(client: TestClient, who: ProjectKey, path: str, **params: Any) -> Any:
    answer = client.get(path, params=params, headers=who.headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _events(client: TestClient, who: ProjectKey, job_id: int) -> list[dict[str, Any]]:
    return list(_get(client, who, f"/v1/jobs/{job_id}/events", limit=1000)["items"])


def _set_up(client: TestClient, engine: Engine, pool: str, receiver: Receiver) -> Story:
    """The organisation's part: project, roles, a cap of 2 slots on `pool`, a webhook; and
    the member's code."""
    cast = set_up_project(client, engine)
    capped = client.put(f"/v1/quotas/{pool}", json={"max_slots": 2}, headers=cast.admin.headers)
    assert capped.status_code == 200, capped.text
    hook = subscribe(client, cast.admin, receiver.url, ["job.*"])
    upload = {"file": ("steps.tar.gz", tar_gz({"steps.py": STEPS_PY}), "application/gzip")}
    code = created(client.post("/v1/code", files=upload, headers=cast.member.headers))
    return Story(cast=cast, pool=pool, hook=hook, code=code["id"])


def _fill_the_cap(client: TestClient, engine: Engine, story: Story, worker: Worker) -> Story:
    """The member's two jobs run; its third waits on the quota with an estimated start."""
    member, viewer = story.cast.member, story.cast.viewer
    low, kept = (
        submit(client, member, _spec(story.pool, story.code, steps=UNTIL_STOPPED, **more))
        for more in ({"priority": 0, "checkpoint_every": CHECKPOINT_EVERY}, {"priority": 10})
    )
    for job in (low, kept):
        wait_state(engine, job["id"], ("running",), TIMEOUT_S, worker)
    third = submit(client, member, _spec(story.pool, story.code, priority=0, steps=4))

    def estimated() -> dict[str, Any] | None:
        queue = _get(client, viewer, f"/v1/jobs/{third['id']}")["queue"]
        return queue if queue and queue["estimated_start_at"] else None

    waiting = wait_for("an estimated start of the third job", estimated, 30)
    assert (waiting["position"], waiting["reason"]) == (1, "quota gpus 2/2")
    assert datetime.fromisoformat(waiting["estimated_start_at"]) > utcnow() - timedelta(seconds=1)
    quotas = _get(client, viewer, "/v1/quotas")["items"]
    assert [
        (q["pool"], q["max_slots"], q["slots_in_use"], q["running_jobs"], q["queued_jobs"])
        for q in quotas
    ] == [(story.pool, 2, 2, 2, 1)]
    return replace(story, low=low["id"], kept=kept["id"], third=third["id"])


def _preempt(client: TestClient, engine: Engine, story: Story, worker: Worker, logs: Path) -> Story:
    """CI's urgent job preempts the member's low one and runs; the low one resumes and trains
    on; the member then cancels its two long jobs (the viewer may not), and the third runs."""
    cast = story.cast
    wait_step(engine, story.low, CHECKPOINT_EVERY, TIMEOUT_S, "the low-priority job")
    urgent = submit(client, cast.ci, _spec(story.pool, story.code, priority=50, steps=2))
    assert_error(client.get(f"/v1/jobs/{urgent['id']}", headers=cast.ci.headers), 403, "forbidden")

    def preempted() -> list[dict[str, Any]]:
        return [e for e in _events(client, cast.viewer, story.low) if e["kind"] == "preempted"]

    def explain() -> str:
        events = _events(client, cast.viewer, story.low)
        seen = [(e["kind"], e.get("state_to"), e["message"]) for e in events[-8:]]
        return f"the low job's last events: {seen}\n{log_tails(logs)}"

    # The reconciler's round (2 s), the worker noticing `preempting`, the program's checkpoint
    # and exit, then the requeue: seconds on an idle host; each can stall on CI's loaded one.
    (yielded,) = wait_for(
        "the reconciler to preempt the low-priority job", preempted, TIMEOUT_S, explain=explain
    )
    done = wait_state(engine, urgent["id"], TERMINAL, TIMEOUT_S, worker)
    assert done.state == "succeeded", done.error
    resumed_at = yielded["data"]["checkpoint_step"]
    wait_step(engine, story.low, resumed_at + 3, TIMEOUT_S, "the resumed job")

    assert_error(
        client.post(f"/v1/jobs/{story.kept}/cancel", headers=cast.viewer.headers), 403, "forbidden"
    )
    for job_id in (story.kept, story.low):
        cancelled = client.post(f"/v1/jobs/{job_id}/cancel", headers=cast.member.headers)
        assert cancelled.status_code == 202, cancelled.text
    story = replace(story, urgent=urgent["id"])
    ends = {j: wait_state(engine, j, TERMINAL, TIMEOUT_S, worker) for j in story.jobs}
    assert {j: job.state for j, job in ends.items()} == {
        story.low: "cancelled",
        story.kept: "cancelled",
        story.third: "succeeded",
        story.urgent: "succeeded",
    }, {j: job.error for j, job in ends.items()}
    return story


def _check_the_resume(client: TestClient, story: Story) -> None:
    """The low job yielded to the urgent one at its stop's checkpoint and its second attempt
    went on from it: no restart counted, every step trained exactly once."""
    viewer = story.cast.viewer
    low = _get(client, viewer, f"/v1/jobs/{story.low}")
    assert (low["attempt"], low["restarts_used"]) == (2, 0)
    events = _events(client, viewer, story.low)
    (preempting,) = [e for e in events if e["state_to"] == "preempting"]
    (preempted,) = [e for e in events if e["kind"] == "preempted"]
    assert preempting["data"]["for_job"] == preempted["data"]["for_job"] == story.urgent
    step = preempted["data"]["checkpoint_step"]
    assert preempted["attempt"] == 1 and step >= CHECKPOINT_EVERY
    saved = [e["data"]["step"] for e in events if e["kind"] == "checkpoint" and e["attempt"] == 1]
    assert saved[-1] == step  # the stop's own checkpoint: no step after it was lost
    resumed = next(e for e in events if e["state_to"] == "running" and e["attempt"] == 2)
    assert resumed["data"]["start_step"] == step
    (loss,) = _get(client, viewer, f"/v1/jobs/{story.low}/metrics", names="loss")["series"]
    assert loss["steps"] == list(range(1, low["current_step"] + 1))
    assert low["current_step"] >= step + 3


def _check_the_webhooks(client: TestClient, story: Story, receiver: Receiver) -> None:
    """Every job event (`job.<state>` per state change, `job.preempted`) arrived signed by
    the subscription's secret, exactly once each (by `webhook-id`), in order per job."""
    happened = {
        job: [
            f"job.{e['state_to']}" if e["kind"] == "state" else "job.preempted"
            for e in _events(client, story.cast.viewer, job)
            if e["kind"] in ("state", "preempted")
        ]
        for job in story.jobs
    }
    total = sum(len(types) for types in happened.values())
    path = f"/v1/webhooks/{story.hook['id']}/deliveries"

    def delivered() -> bool:
        log = _get(client, story.cast.admin, path)["items"]
        return len(log) == total and all(d["status"] == "delivered" for d in log)

    wait_for(f"{total} webhook deliveries", delivered, 30)
    assert len(receiver.unique()) == total
    secret = story.hook["secret"]["secret"]
    bodies = sorted(
        (r.verify(secret) for r in receiver.unique().values()), key=lambda b: b["sequence"]
    )
    assert all(r.verify(secret)["id"] == r.webhook_id for r in receiver.received)
    got: dict[int, list[str]] = {job: [] for job in story.jobs}
    for body in bodies:
        got[body["data"]["job"]["id"]].append(body["type"])
    assert got == happened
    assert happened[story.low].count("job.preempted") == 1
    assert happened[story.urgent][-1] == "job.succeeded"


def _check_the_usage(client: TestClient, story: Story, since: datetime) -> None:
    """`GET /v1/usage` by job shows the slot-seconds of each job, as each job shows its own."""
    viewer = story.cast.viewer
    report = _get(client, viewer, "/v1/usage", group_by="job", since=since.isoformat())
    rows = {r["job_id"]: r for r in report["rows"]}
    assert set(rows) == set(story.jobs)
    for job in story.jobs:
        assert rows[job]["slot_seconds"] > 0 and rows[job]["pool"] == story.pool
        shown = _get(client, viewer, f"/v1/jobs/{job}")["usage"]
        assert shown["slot_seconds"] == pytest.approx(rows[job]["slot_seconds"])
    assert report["total"]["slot_seconds"] == pytest.approx(
        sum(r["slot_seconds"] for r in rows.values())
    )


def _check_the_viewer(client: TestClient, story: Story) -> None:
    """The viewer reads the jobs, their events and metrics, quotas and usage; each change it
    tries is 403 and leaves things as they were; the audit log (admins') records each."""
    cast, viewer = story.cast, story.cast.viewer
    listed = {j["id"] for j in _get(client, viewer, "/v1/jobs")["items"]}
    assert listed == set(story.jobs)
    before = {
        "job": _get(client, viewer, f"/v1/jobs/{story.low}"),
        "quotas": _get(client, viewer, "/v1/quotas"),
        "webhooks": _get(client, cast.admin, "/v1/webhooks"),
    }
    tries = [
        ("POST", "/v1/jobs", _spec(story.pool, story.code, priority=99, steps=2)),
        ("POST", f"/v1/jobs/{story.third}/cancel", None),
        ("PATCH", f"/v1/jobs/{story.low}", {"labels": {"seen": "yes"}, "note": "mine"}),
        ("POST", "/v1/webhooks", {"url": "http://127.0.0.1:9/x", "event_types": ["job.*"]}),
        ("PUT", f"/v1/quotas/{story.pool}", {"max_slots": 8}),
    ]
    for method, path, body in tries:
        answer = client.request(method, path, json=body, headers=viewer.headers)
        assert_error(answer, 403, "forbidden")
    # Webhook deliveries and the audit log are the admins' to read.
    for path in (f"/v1/webhooks/{story.hook['id']}/deliveries", "/v1/audit"):
        assert_error(client.get(path, headers=viewer.headers), 403, "forbidden")
    assert before == {
        "job": _get(client, viewer, f"/v1/jobs/{story.low}"),
        "quotas": _get(client, viewer, "/v1/quotas"),
        "webhooks": _get(client, cast.admin, "/v1/webhooks"),
    }
    assert {j["id"] for j in _get(client, viewer, "/v1/jobs")["items"]} == set(story.jobs)

    def denied() -> set[tuple[str, str]]:
        page = _get(client, cast.admin, "/v1/audit", actor="viewer", outcome="denied", limit=50)
        return {(e["method"], e["path"]) for e in page["items"]}

    wanted = {(method, path) for method, path, _ in tries}
    wait_for("the viewer's refused changes in the audit log", lambda: wanted <= denied(), 10)


@pytest.mark.long  # five launches, mostly one after another
def test_an_orgs_project_caps_preempts_notifies_bills_and_keeps_its_viewer_read_only(
    client: TestClient,
    engine: Engine,
    receiver: Receiver,
    pool_worker: Worker,
    pool: str,
    worker_logs: Path,
) -> None:
    since = utcnow() - timedelta(minutes=1)
    story = _set_up(client, engine, pool, receiver)
    story = _fill_the_cap(client, engine, story, pool_worker)
    story = _preempt(client, engine, story, pool_worker, worker_logs)
    _check_the_resume(client, story)
    _check_the_webhooks(client, story, receiver)
    _check_the_usage(client, story, since)
    _check_the_viewer(client, story)
