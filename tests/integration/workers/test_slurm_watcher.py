"""The Slurm submitter's watcher and placing (`workers.slurm.submitter`) on the test Postgres,
with Slurm's answers given (no cluster needed): what each answer does to the placement, the job
and its attempt. The same code against a real Slurm: test_slurm.py."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.settings import Settings, SlurmPool
from core.platform.tables import SlurmJob
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import create_job, job_row, tiny_spec, unique_queue
from workers.slurm import batch, submitter

SLURM_ID = 4711


@pytest.fixture
def slurm_settings(settings: Settings) -> tuple[Settings, str]:
    pool = unique_queue("slurmw")
    return settings.model_copy(update={"slurm_pools": {pool: SlurmPool()}}), pool


class Calls:
    """What the watcher asked of Slurm and the broker."""

    def __init__(self, states: dict[int, batch.SlurmState]) -> None:
        self.states = states
        self.cancelled: list[int] = []
        self.dispatched: list[tuple[int, str]] = []

    def query(self, ids: Iterable[int]) -> dict[int, batch.SlurmState]:
        return {i: self.states[i] for i in ids if i in self.states}

    def follow(self, settings: Settings, engine: Engine, pool: str) -> None:
        submitter.follow(
            settings=settings,
            factory=lambda: Session(engine, expire_on_commit=False),
            dispatch=lambda job_id, queue: self.dispatched.append((job_id, queue)),
            pools=[pool],
            query=self.query,
            cancel=self.cancelled.append,
        )


def _state(state: str, *, reason: str | None = None, restarts: int = 0) -> batch.SlurmState:
    return batch.SlurmState(SLURM_ID, state, reason, None, None, None, restarts, "vm")


def _placed(engine: Engine, settings: Settings, job_id: int) -> None:
    """Place the job as the submitter does, `sbatch` answering SLURM_ID."""
    outcome = submitter.place(
        job_id,
        settings=settings,
        factory=lambda: Session(engine, expire_on_commit=False),
        submit=lambda _script: SLURM_ID,
    )
    assert outcome == f"submitted as Slurm job {SLURM_ID}", outcome


def _placements(engine: Engine, job_id: int) -> list[SlurmJob]:
    with Session(engine, expire_on_commit=False) as s:
        query = select(SlurmJob).where(SlurmJob.job_id == job_id).order_by(SlurmJob.id)
        return list(s.execute(query).scalars())


def _job(engine: Engine, project: ProjectKey, pool: str, dataset_id: str, **kw: object) -> int:
    return create_job(engine, project, tiny_spec(pool=pool, dataset_id=dataset_id, **kw))


def _claim(engine: Engine, job_id: int, run: int) -> None:
    with Session(engine) as s:
        worker = submitter.agent_worker(SLURM_ID, run, "vm")
        assert jobs.claim(session=s, job_id=job_id, worker=worker) is not None
        jobs.transition(session=s, job_id=job_id, to="running")
        s.commit()


def test_a_pending_job_gets_slurms_reason_and_a_second_delivery_submits_nothing(
    engine: Engine, slurm_settings: tuple[Settings, str], project: ProjectKey, dataset_id: str
) -> None:
    settings, pool = slurm_settings
    job_id = _job(engine, project, pool, dataset_id)
    _placed(engine, settings, job_id)
    again = submitter.place(
        job_id,
        settings=settings,
        factory=lambda: Session(engine, expire_on_commit=False),
        submit=lambda _script: pytest.fail("a second sbatch"),
    )
    assert again == "already placed"
    calls = Calls({SLURM_ID: _state("PENDING", reason="Resources")})
    calls.follow(settings, engine, pool)
    (row,) = _placements(engine, job_id)
    assert (row.state, row.reason, row.ended_at) == ("PENDING", "Resources", None)
    assert calls.cancelled == [] and calls.dispatched == []


def test_a_job_cancelled_while_slurm_holds_it_is_scancelled(
    engine: Engine, slurm_settings: tuple[Settings, str], project: ProjectKey, dataset_id: str
) -> None:
    settings, pool = slurm_settings
    job_id = _job(engine, project, pool, dataset_id)
    _placed(engine, settings, job_id)
    with Session(engine) as s:
        jobs.cancel(session=s, job_id=job_id)
        s.commit()
    calls = Calls({SLURM_ID: _state("PENDING", reason="Priority")})
    calls.follow(settings, engine, pool)
    assert calls.cancelled == [SLURM_ID]
    calls.states[SLURM_ID] = _state("CANCELLED")
    calls.follow(settings, engine, pool)
    (row,) = _placements(engine, job_id)
    assert row.ended_at is not None and not row.claimed
    assert job_row(engine, job_id).state == "cancelled" and calls.dispatched == []


def test_a_requeue_under_the_run_that_holds_the_attempt_fails_it_as_node_lost(
    engine: Engine, slurm_settings: tuple[Settings, str], project: ProjectKey, dataset_id: str
) -> None:
    """Run 0 claimed the attempt; Slurm says PENDING after a requeue (restarts 1): run 0's
    agents are gone without recording anything, so the attempt fails (`node_lost`), the retry
    policy restarts it and the job is dispatched; the placement stays live (Slurm runs it
    again)."""
    settings, pool = slurm_settings
    job_id = _job(engine, project, pool, dataset_id, retries={"max_restarts": 1})
    _placed(engine, settings, job_id)
    _claim(engine, job_id, run=0)
    calls = Calls({SLURM_ID: _state("PENDING", reason="BeginTime", restarts=1)})
    calls.follow(settings, engine, pool)
    job = job_row(engine, job_id)
    assert job.state == "queued" and job.restarts_used == 1, job.state
    assert job.failure is not None and job.failure["class"] == "node_lost", job.failure
    assert "Slurm requeued the allocation (BeginTime)" in job.failure["reason"]
    assert calls.dispatched == [(job_id, pool)] and calls.cancelled == []
    (row,) = _placements(engine, job_id)
    assert row.ended_at is None and row.claimed


def test_a_stale_pending_answer_does_not_fail_the_claim_of_the_next_run(
    engine: Engine, slurm_settings: tuple[Settings, str], project: ProjectKey, dataset_id: str
) -> None:
    """squeue answered PENDING (restarts 1) just before the requeued job's run 1 claimed the
    attempt: the claim is newer than the answer, and nothing happens to it."""
    settings, pool = slurm_settings
    job_id = _job(engine, project, pool, dataset_id)
    _placed(engine, settings, job_id)
    _claim(engine, job_id, run=1)
    calls = Calls({SLURM_ID: _state("PENDING", reason="BeginTime", restarts=1)})
    calls.follow(settings, engine, pool)
    assert job_row(engine, job_id).state == "running"
    assert calls.dispatched == [] and calls.cancelled == []


def test_an_allocation_that_ended_out_of_memory_under_a_live_attempt_fails_it_as_oom(
    engine: Engine, slurm_settings: tuple[Settings, str], project: ProjectKey, dataset_id: str
) -> None:
    settings, pool = slurm_settings
    job_id = _job(engine, project, pool, dataset_id)
    _placed(engine, settings, job_id)
    _claim(engine, job_id, run=0)
    calls = Calls({SLURM_ID: _state("OUT_OF_MEMORY")})
    calls.follow(settings, engine, pool)
    job = job_row(engine, job_id)
    assert job.state == "failed" and job.failure is not None
    assert job.failure["class"] == "oom", job.failure
    (row,) = _placements(engine, job_id)
    assert row.ended_at is not None and row.state == "OUT_OF_MEMORY"


def test_a_handed_back_job_is_placed_again_once_its_allocation_ended(
    engine: Engine, slurm_settings: tuple[Settings, str], project: ProjectKey, dataset_id: str
) -> None:
    """The agents handed the job back (queued) and the allocation COMPLETED: the placement
    closes and the job is dispatched, so the submitter places it anew."""
    settings, pool = slurm_settings
    job_id = _job(engine, project, pool, dataset_id)
    _placed(engine, settings, job_id)
    calls = Calls({SLURM_ID: _state("COMPLETED")})
    calls.follow(settings, engine, pool)
    assert calls.dispatched == [(job_id, pool)]
    assert _placements(engine, job_id)[0].ended_at is not None
    assert job_row(engine, job_id).state == "queued"


def test_allocations_that_keep_ending_unclaimed_stop_the_placing(
    engine: Engine, slurm_settings: tuple[Settings, str], project: ProjectKey, dataset_id: str
) -> None:
    """An agent that never claims (it cannot start on the nodes) would make sbatch loop: after
    `MAX_UNCLAIMED` unclaimed ends in a row the submitter stops placing the job."""
    settings, pool = slurm_settings
    job_id = _job(engine, project, pool, dataset_id)
    for _ in range(submitter.MAX_UNCLAIMED):
        _placed(engine, settings, job_id)
        Calls({SLURM_ID: _state("FAILED")}).follow(settings, engine, pool)
    refused = submitter.place(
        job_id,
        settings=settings,
        factory=lambda: Session(engine, expire_on_commit=False),
        submit=lambda _script: pytest.fail("a fourth sbatch"),
    )
    assert refused == "not placed: its allocations keep ending unclaimed"
    assert len(_placements(engine, job_id)) == submitter.MAX_UNCLAIMED
    job = job_row(engine, job_id)
    assert job.state == "queued" and job.wait_reason is not None
    assert job.wait_reason.startswith("slurm: 3 allocations in a row ended before"), job.wait_reason


def test_a_failed_sbatch_leaves_the_job_queued_and_never_counts_against_it(
    engine: Engine, slurm_settings: tuple[Settings, str], project: ProjectKey, dataset_id: str
) -> None:
    """Slurm's controller unreachable: each delivery's sbatch fails, the job stays queued with
    its placements closed as SUBMIT_FAILED, and once Slurm answers again the next delivery
    places it (failed submissions are not allocations that ended unclaimed)."""
    settings, pool = slurm_settings
    job_id = _job(engine, project, pool, dataset_id)

    def down(_script: str) -> int:
        raise submitter.SlurmUnavailable("sbatch exited 1: Unable to contact slurm controller")

    for _ in range(submitter.MAX_UNCLAIMED + 1):
        outcome = submitter.place(
            job_id,
            settings=settings,
            factory=lambda: Session(engine, expire_on_commit=False),
            submit=down,
        )
        assert outcome.startswith("sbatch failed: sbatch exited 1"), outcome
    assert job_row(engine, job_id).state == "queued"
    assert {p.state for p in _placements(engine, job_id)} == {"SUBMIT_FAILED"}
    _placed(engine, settings, job_id)
