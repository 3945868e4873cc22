"""The scheduler: a worker claims the best queued job of its pool, on Postgres and on SQLite."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.access import auth
from core.jobs import service as jobs
from core.platform.db import make_engine, session_scope, upgrade
from core.platform.tables import Job
from core.scheduling import claim as scheduling
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import tiny_spec, unique_queue


def _submit(engine: Engine, project_id: str, pool: str, priority: int, procs: int = 1) -> int:
    spec = tiny_spec(
        pool=pool, dataset_id="ds_unused", priority=priority, resources={"procs_per_node": procs}
    )
    with Session(engine, expire_on_commit=False) as s:
        return jobs.create(session=s, project_id=project_id, spec=spec).job.id


def _claim_order(engine: Engine, pool: str) -> list[int]:
    order = []
    while True:
        with session_scope(engine) as s:
            job = scheduling.claim_next(session=s, pool=pool, worker="w")
            if job is None:
                return order
            assert job.state == "starting" and job.attempt == 1
            order.append(job.id)


def _scheduling_holds(engine: Engine, project_id: str) -> None:
    pool, other = unique_queue("sched"), unique_queue("other")
    low = _submit(engine, project_id, pool, -5)
    first = _submit(engine, project_id, pool, 0)
    urgent = _submit(engine, project_id, pool, 7)
    second = _submit(engine, project_id, pool, 0)
    elsewhere = _submit(engine, project_id, other, 100)
    with Session(engine) as s:
        queued = [s.get(Job, i) for i in (low, first, urgent, second, elsewhere)]
        positions = scheduling.queue_positions(session=s, queued=[j for j in queued if j])
    assert positions == {urgent: 1, first: 2, second: 3, low: 4, elsewhere: 1}
    assert _claim_order(engine, pool) == [urgent, first, second, low]
    with session_scope(engine) as s:  # fencing: a claimed job is never claimed again
        assert jobs.claim(session=s, job_id=urgent, worker="late") is None


def _only_what_fits_is_claimed(engine: Engine, project_id: str) -> None:
    pool = unique_queue("fit")
    big = _submit(engine, project_id, pool, 5, procs=4)
    pair = _submit(engine, project_id, pool, 0, procs=2)
    single = _submit(engine, project_id, pool, 0, procs=1)
    other_single = _submit(engine, project_id, pool, 0, procs=1)

    def claim(free: int | None, reserve: scheduling.Reserve | None = None) -> int | None:
        with session_scope(engine) as s:
            job = scheduling.claim_next(
                session=s, pool=pool, worker="w", max_slots=free, reserve=reserve
            )
            return None if job is None else job.id

    # The 4-device head has waited long enough: a claimant that could ever fit it takes
    # nothing smaller; one that never could (2 devices in all) is not held back.
    assert claim(1, scheduling.Reserve(after_s=0.0, largest_job=4)) is None
    assert claim(1, scheduling.Reserve(after_s=0.0, largest_job=None)) is None
    assert claim(1, scheduling.Reserve(after_s=3600.0, largest_job=4)) == single
    assert claim(1, scheduling.Reserve(after_s=0.0, largest_job=2)) == other_single
    assert claim(1) is None  # the 4- and 2-device jobs ahead do not fit
    with Session(engine) as s:  # the big job keeps its place at the head
        assert scheduling.head_of_queue(session=s, pool=pool) == big
        waiting = s.get(Job, big)
        assert waiting is not None
        assert scheduling.waiting_for(waiting) == f"4 free devices on one worker of pool {pool!r}"
    assert claim(3) == pair
    assert claim(4) == big
    with Session(engine) as s:
        assert scheduling.head_of_queue(session=s, pool=pool) is None


def test_claims_follow_priority_then_age_on_postgres(engine: Engine, project: ProjectKey) -> None:
    _scheduling_holds(engine, project.project_id)


def test_a_claim_takes_the_best_job_that_fits_the_free_devices_on_postgres(
    engine: Engine, project: ProjectKey
) -> None:
    _only_what_fits_is_claimed(engine, project.project_id)


def test_claims_follow_priority_age_and_free_devices_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'torchyard.db'}"
    upgrade(url)  # migration 0002 applies on SQLite too (batch mode)
    engine = make_engine(url)
    with session_scope(engine) as s:
        project_id = auth.create_project(session=s, name="p").id
    _scheduling_holds(engine, project_id)
    _only_what_fits_is_claimed(engine, project_id)
    engine.dispose()
