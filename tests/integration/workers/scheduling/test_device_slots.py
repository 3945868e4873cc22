"""Several jobs per host: one worker with 4 CPU slots runs jobs of 1, 2 and 1 devices at once on
disjoint devices, a job of 4 waits for all of them, and a cancelled job's slot goes to the job
queued behind it (real Celery threads pool, real torchrun, Postgres and Redis).

Every job runs `STEPS_PY`, which trains nothing: a slot is a slot whichever program runs in it,
and trainers spinning on every slot of a 2-core host would only slow down the starts the test
waits for. The jobs that hold slots until cancelled have no end of their own; the job of 4 and
the jobs that queue behind it run to success, their last step held until the test opens their
gate, so which job is running when is the test's decision, not a race.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.settings import Settings
from core.platform.tables import JobNode
from core.platform.tables import Worker as WorkerRow
from tests.conftest import ProjectKey
from tests.integration.workers.archives import UNTIL_STOPPED, open_gate, steps_spec
from tests.integration.workers.helpers import (
    Worker,
    job_events,
    job_row,
    launches,
    start_worker,
    unique_queue,
    wait_for,
    wait_state,
)
from tests.integration.workers.helpers import submit as submit_job


@pytest.fixture(scope="module")
def host(settings: Settings, celery_client: Celery, worker_logs: Path) -> Iterator[Worker]:
    """A worker owning 4 CPU slots (threads pool, one thread per slot)."""
    w = start_worker(
        settings=settings,
        client=celery_client,
        queue=unique_queue("slots"),
        log_dir=worker_logs,
        slots=4,
    )
    yield w
    w.stop()


def submit(
    engine: Engine, client: Celery, project: ProjectKey, host: Worker, code: str, procs: int,
    gate: str,
) -> int:  # fmt: skip
    """A 4-step job on `procs` devices whose last step waits for its gate `gate` (`open_gate`)."""
    spec = steps_spec(code, pool=host.queue, steps=4, procs=procs, gate=gate)
    return submit_job(engine, client, project, spec)


def submit_idle(
    engine: Engine, client: Celery, project: ProjectKey, host: Worker, code: str, procs: int
) -> int:
    """A job on `procs` devices that runs until it is cancelled."""
    spec = steps_spec(code, pool=host.queue, steps=UNTIL_STOPPED, procs=procs, step_s=0.1)
    return submit_job(engine, client, project, spec)


def node_devices(engine: Engine, job_id: int) -> list[int]:
    """The devices on the job_nodes row of the job's current attempt."""
    attempt = job_row(engine, job_id).attempt
    with Session(engine) as s:
        (devices,) = s.execute(
            select(JobNode.devices).where(JobNode.job_id == job_id, JobNode.attempt == attempt)
        ).one()
    return list(devices or [])


def cancel(engine: Engine, job_id: int) -> None:
    with Session(engine) as s:
        jobs.cancel(session=s, job_id=job_id)
        s.commit()


def deliveries_that_claimed_nothing(host: Worker) -> int:
    """How many deliveries found no queued job that fits (a message is a token for its pool:
    which message claims which job is the broker's order)."""
    return host.log.count(": not claimed (")


def wait_unclaimed(host: Worker, seen: int) -> None:
    wait_for(
        "a delivery that finds no job fitting the free devices",
        lambda: deliveries_that_claimed_nothing(host) > seen,
        30,
    )


def all_running(engine: Engine, job_ids: list[int]) -> bool:
    return all(job_row(engine, j).state == "running" for j in job_ids)


def seconds(later: datetime | None, earlier: datetime | None) -> float:
    assert later is not None and earlier is not None
    return (later - earlier).total_seconds()


def test_jobs_of_1_2_1_share_four_slots_a_job_of_4_waits_and_freed_slots_are_reused(
    engine: Engine,
    celery_client: Celery,
    project: ProjectKey,
    host: Worker,
    steps_code: str,
    settings: Settings,
) -> None:
    started = time.monotonic()
    idle = (engine, celery_client, project, host, steps_code)
    first, pair, third = (submit_idle(*idle, procs) for procs in (1, 2, 1))
    big = submit(*idle, 4, "go")

    # Jobs of 1, 2 and 1 devices run at the same time, on disjoint devices.
    trio = [first, pair, third]
    wait_for("jobs of 1, 2 and 1 devices running at once", lambda: all_running(engine, trio), 150)
    overlap_s = time.monotonic() - started
    devices = {j: node_devices(engine, j) for j in trio}
    assert [len(devices[j]) for j in trio] == [1, 2, 1]
    assert sorted(d for ds in devices.values() for d in ds) == [0, 1, 2, 3]
    for j in trio:
        (launch,) = launches(job_events(engine, j))
        assert launch.data["devices"] == devices[j]
    # The worker's row says what it owns and what is left (`workers.liveness`, every 2 s).
    wait_for("the worker row's free slots", lambda: _slots(engine, host) == (4, 0), 10)
    # The job of 4 found no room: its delivery claimed nothing and it keeps its place.
    assert job_row(engine, big).state == "queued"
    wait_unclaimed(host, 0)

    # A job of 1 queued behind the job of 4 waits, then takes the slot a cancelled job frees.
    seen = deliveries_that_claimed_nothing(host)
    behind = submit_idle(*idle, 1)
    wait_unclaimed(host, seen)
    assert job_row(engine, behind).state == "queued"
    cancel(engine, first)
    wait_state(engine, first, ("cancelled",), 30, host)
    resumed = wait_state(engine, behind, ("running",), 60, host)
    slot_reuse_s = seconds(resumed.started_at, job_row(engine, first).finished_at)
    assert node_devices(engine, behind) == devices[first]
    assert job_row(engine, big).state == "queued"

    # The job of 4 runs once every other job has ended, on all four devices.
    for j in (pair, third, behind):
        cancel(engine, j)
    wait_state(engine, big, ("starting", "running"), 60, host)
    # Two jobs of 1 sent while it holds every device find no room; when it ends, both run:
    # its end wakes the pool once, and the claim that leaves devices free wakes it again.
    seen = deliveries_that_claimed_nothing(host)
    after = [submit(*idle, 1, "go") for _ in range(2)]
    wait_unclaimed(host, seen + 1)
    assert [job_row(engine, j).state for j in after] == ["queued", "queued"]
    open_gate(settings, big, "go")
    done = wait_state(engine, big, ("succeeded", "failed"), 120, host)
    assert done.state == "succeeded", done.error
    assert node_devices(engine, big) == [0, 1, 2, 3]
    last_end = max(job_row(engine, j).finished_at for j in (pair, third, behind))  # type: ignore[type-var]
    assert seconds(done.started_at, last_end) >= 0
    wait_for("both jobs of 1 running after it", lambda: all_running(engine, after), 60)
    for j in after:
        open_gate(settings, j, "go")
    ends = [wait_state(engine, j, ("succeeded", "failed"), 60, host) for j in after]
    assert [e.state for e in ends] == ["succeeded", "succeeded"]
    assert all(seconds(e.started_at, done.finished_at) >= 0 for e in ends)
    # Together, not one after the other: the second did not wait for the first to end.
    assert max(e.started_at for e in ends) < min(e.finished_at for e in ends)  # type: ignore[type-var]
    print(
        f"\n[slots] 3 jobs running at once after {overlap_s:.1f} s; slot of a cancelled job "
        f"reused after {slot_reuse_s:.2f} s; job of 4 claimed "
        f"{seconds(done.started_at, last_end):.2f} s after the last end; the two jobs after it "
        f"{[round(seconds(job_row(engine, j).started_at, done.finished_at), 2) for j in after]} s "
        f"after its end; test {time.monotonic() - started:.1f} s"
    )


def _slots(engine: Engine, host: Worker) -> tuple[int, int | None] | None:
    """(slots_total, slots_free) of the worker's row in `workers`, None before its first beat."""
    with Session(engine) as session:
        row = session.get(WorkerRow, host.name)
        return None if row is None else (row.slots_total, row.slots_free)
