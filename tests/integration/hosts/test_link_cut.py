"""A host's network cable pulled mid-run (`ip link set down` on its link's root end), with a
two-node gang on it and another host: the controller notices within 15 s, the attempt ends on
the surviving host (no orphaned rank keeps training), the job resumes on the remaining hosts
from its last complete checkpoint with each step's loss stored once; once the cable is back,
the cut host's worker rejoins without a restart and stops the ranks it was left with."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from celery import Celery
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.tables import Checkpoint
from core.platform.tables import Worker as WorkerRow
from tests.conftest import ProjectKey
from tests.integration.faults.test_gang import gang_spec, nodes_of
from tests.integration.hosts.conftest import HostWorker
from tests.integration.hosts.netns import Network
from tests.integration.workers.controllers import Controller, start_controller
from tests.integration.workers.helpers import (
    TERMINAL,
    group_gone,
    job_events,
    launches,
    metric_series,
    submit,
    unique_queue,
    wait_for,
    wait_state,
)
from tests.support.figures import bound, record

pytestmark = [pytest.mark.hosts, pytest.mark.s3]

STEPS = 300
EVERY = 25
NOTICED_WITHIN_S = 15.0  # worker_timeout_s (10 s) + a reconcile round (2 s) + slack
START_S = 60.0  # a controller's or a worker's start on a loaded host


def _newest_recorded(engine: Engine, job_id: int) -> int:
    with Session(engine) as s:
        found = s.scalar(select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job_id))
    return found or 0


def _heartbeat_at(engine: Engine, name: str) -> datetime | None:
    with Session(engine) as s:
        at = s.scalar(select(WorkerRow.heartbeat_at).where(WorkerRow.name == name))
    return None if at is None else at.astimezone(UTC)


@pytest.mark.long  # ~2 min
def test_a_cut_link_ends_the_attempt_everywhere_and_the_job_resumes_on_the_other_hosts(
    engine: Engine,
    s3_settings: Settings,
    celery_client: Celery,
    network: Network,
    host_worker: HostWorker,
    uploaded: tuple[ProjectKey, str],
    controllers: list[Controller],
    worker_logs: object,
) -> None:
    project, dataset_id = uploaded
    a, b, c = network.add_host(), network.add_host(), network.add_host()
    queue = unique_queue("cut")
    controller = start_controller(controllers, s3_settings, worker_logs)  # type: ignore[arg-type]
    wait_for("the controller to lead", lambda: controller.says("controller: leading"), START_S)
    on_a, on_b = host_worker(a, queue), host_worker(b, queue)
    spec = gang_spec(
        queue,
        dataset_id,
        nodes=2,
        procs=1,
        train={"max_steps": STEPS},
        eval={"interval_steps": STEPS},
        checkpoint={"interval_steps": EVERY},
        retries={"max_restarts": 2},
    )
    job_id = submit(engine, celery_client, project, spec)
    wait_for(
        f"a checkpoint at step >= {EVERY} recorded",
        lambda: _newest_recorded(engine, job_id) >= EVERY,
        180,
    )
    network.cut(b)
    cut = time.monotonic()
    on_c = host_worker(c, queue)  # a spare host joins, as an autoscaler would add one

    def restarting() -> object | None:
        return next((e for e in job_events(engine, job_id) if e.state_to == "restarting"), None)

    noticed = wait_for("the attempt to end", restarting, 60)
    noticed_s = time.monotonic() - cut
    assert noticed.data["failure_class"] == "node_lost", noticed.data
    record("link cut -> attempt ended", noticed_s, NOTICED_WITHIN_S)
    assert noticed_s <= bound(NOTICED_WITHIN_S), f"noticed {noticed_s:.1f} s after the cut"
    attempt_1 = [e for e in launches(job_events(engine, job_id)) if e.attempt == 1]
    rank_of = {n.node_rank: n.worker for n in nodes_of(engine, job_id, 1)}
    on_a_pgids = [
        e.data["pgid"] for e in attempt_1 if rank_of[e.data["node_rank"]] == on_a.name
    ]  # fmt: skip
    assert len(on_a_pgids) == 1
    wait_for("the surviving host's ranks to be gone", lambda: group_gone(on_a_pgids[0]), 30)
    ended_s = time.monotonic() - cut

    def training_again() -> bool:
        return any(p.attempt == 2 for p in metric_series(engine, job_id, "loss"))

    wait_for("attempt 2 to train", training_again, 180)
    again_s = time.monotonic() - cut
    job = wait_state(engine, job_id, TERMINAL, 300, on_a)
    assert job.state == "succeeded", f"{job.error}\n{on_c.log[-4000:]}"
    assert job.attempt == 2
    assert {n.worker for n in nodes_of(engine, job_id, 2)} == {on_a.name, on_c.name}
    resumed = next(
        e for e in job_events(engine, job_id) if e.state_to == "running" and e.attempt == 2
    )
    assert resumed.data["start_step"] >= EVERY and resumed.data["start_step"] % EVERY == 0
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, STEPS + 1))

    # The cable back: the cut host's worker (the same process) beats again and stops the ranks
    # of the attempt it lost.
    assert on_b.proc.poll() is None
    network.restore(b)
    restored, restored_at = time.monotonic(), datetime.now(UTC)
    wait_for(
        "the cut host's worker to beat again",
        lambda: (_heartbeat_at(engine, on_b.name) or restored_at) > restored_at,
        60,
    )
    rejoin_s = time.monotonic() - restored
    on_b_pgids = [e.data["pgid"] for e in attempt_1 if e.data["pgid"] not in on_a_pgids]
    wait_for("the cut host's old ranks to be gone", lambda: all(map(group_gone, on_b_pgids)), 60)
    wait_for(
        "the cut host's worker to answer the broker again",
        lambda: bool(celery_client.control.ping(destination=[on_b.name], timeout=1.0)),
        120,
        0.0,
    )
    consuming_s = time.monotonic() - restored
    assert on_b.proc.poll() is None  # the same process: nothing restarted it
    print(
        f"link cut -> attempt ended (node_lost) {noticed_s:.1f} s, surviving ranks gone "
        f"{ended_s:.1f} s, training again {again_s:.1f} s; restored -> worker beating "
        f"{rejoin_s:.1f} s, answering the broker {consuming_s:.1f} s"
    )
