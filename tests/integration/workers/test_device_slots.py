"""Several jobs per host: one worker with 4 CPU slots runs jobs of 1, 2 and 1 devices at once on
disjoint devices, a job of 4 waits for all of them, and a cancelled job's slot goes to the job
queued behind it (real Celery threads pool, real torchrun, Postgres and Redis)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core import jobs
from core.models import JobNode
from core.models import Worker as WorkerRow
from core.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    Worker,
    create_job,
    job_events,
    job_row,
    launches,
    send,
    start_worker,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
)

UNTIL_CANCELLED: dict[str, Any] = {
    "train": {"max_steps": 100_000},
    "eval": {"interval_steps": 100_000},
    "checkpoint": {"interval_steps": 100_000},
}
SHORT: dict[str, Any] = {
    "train": {"max_steps": 4},
    "eval": {"interval_steps": 4, "num_batches": 1},
    "checkpoint": {"interval_steps": 4},
}


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
    engine: Engine, client: Celery, project: ProjectKey, host: Worker, dataset_id: str, procs: int,
    run: dict[str, Any],
) -> int:  # fmt: skip
    spec = tiny_spec(
        pool=host.queue, dataset_id=dataset_id, resources={"procs_per_node": procs}, **run
    )
    job_id = create_job(engine, project, spec)
    send(client, job_id, host.queue)
    return job_id


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
    engine: Engine, celery_client: Celery, project: ProjectKey, host: Worker, dataset_id: str
) -> None:
    started = time.monotonic()
    args = (engine, celery_client, project, host, dataset_id)
    first, pair, third = (submit(*args, procs, UNTIL_CANCELLED) for procs in (1, 2, 1))
    big = submit(*args, 4, SHORT)

    # Jobs of 1, 2 and 1 devices train at the same time, on disjoint devices.
    trio = [first, pair, third]
    wait_for("jobs of 1, 2 and 1 devices training at once", lambda: all_running(engine, trio), 150)
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
    behind = submit(*args, 1, UNTIL_CANCELLED)
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
    after = [submit(*args, 1, SHORT) for _ in range(2)]
    wait_unclaimed(host, seen + 1)
    done = wait_state(engine, big, ("succeeded", "failed"), 120, host)
    assert done.state == "succeeded", done.error
    assert node_devices(engine, big) == [0, 1, 2, 3]
    last_end = max(job_row(engine, j).finished_at for j in (pair, third, behind))  # type: ignore[type-var]
    assert seconds(done.started_at, last_end) >= 0
    ends = [wait_state(engine, j, ("succeeded", "failed"), 60, host) for j in after]
    assert [e.state for e in ends] == ["succeeded", "succeeded"]
    assert all(seconds(e.started_at, done.finished_at) >= 0 for e in ends)
    # Together, not one after the other: the second did not wait for the first to end.
    assert max(e.started_at for e in ends) < min(e.finished_at for e in ends)  # type: ignore[type-var]
    print(
        f"\n[slots] 3 jobs training at once after {overlap_s:.1f} s; slot of a cancelled job "
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
