"""Gang node slots on the real Postgres: fencing joins, release, the end, the reaper."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from core.attempts import gang
from core.attempts.lifecycle_policy import NodeEnd, Stop
from core.jobs import service as jobs
from core.platform.settings import Settings
from core.platform.tables import Job, JobNode, utcnow
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import create_job, job_events, job_row, tiny_spec
from workers import reconcile


def claimed_gang(engine: Engine, project: ProjectKey, dataset_id: str, nodes: int) -> Job:
    spec = tiny_spec(pool="gang-slots", dataset_id=dataset_id, resources={"nodes": nodes})
    job_id = create_job(engine, project, spec)
    with Session(engine, expire_on_commit=False) as s:
        job = jobs.claim(session=s, job_id=job_id, worker="w0")
        assert job is not None
        s.commit()
        gang.publish(session=s, job=job, worker="w0", host="127.0.0.1", port=29999)
    return job


def join(engine: Engine, job: Job, worker: str, attempt: int | None = None) -> int | None:
    with Session(engine, expire_on_commit=False) as s:
        return gang.join(
            session=s,
            job_id=job.id,
            attempt=job.attempt if attempt is None else attempt,
            worker=worker,
            host="127.0.0.1",
        )


def test_concurrent_joins_take_each_slot_once_and_extra_ones_find_none(
    engine: Engine, project: ProjectKey, dataset_id: str
) -> None:
    job = claimed_gang(engine, project, dataset_id, nodes=3)
    # Four deliveries race for the two free slots (two of them duplicates of a message).
    with ThreadPoolExecutor(4) as pool:
        ranks = list(pool.map(lambda w: join(engine, job, w), ["w1", "w2", "w3", "w4"]))
    assert sorted(r for r in ranks if r is not None) == [1, 2]
    assert ranks.count(None) == 2
    with Session(engine) as s:
        slots = gang.members(session=s, job_id=job.id, attempt=job.attempt)
        assert gang.assembled(slots)
        assert len({n.worker for n in slots}) == 3
        # An assembled gang is not released, and a stale attempt's join finds nothing.
        assert not gang.release(session=s, job_id=job.id, attempt=job.attempt, reason="late")
    assert join(engine, job, "w5", attempt=job.attempt - 1) is None
    assert job_row(engine, job.id).state == "starting"


def test_release_requeues_without_using_the_restart_budget_and_fences_late_joins(
    engine: Engine, project: ProjectKey, dataset_id: str
) -> None:
    job = claimed_gang(engine, project, dataset_id, nodes=2)
    with Session(engine) as s:
        assert gang.release(session=s, job_id=job.id, attempt=job.attempt, reason="too slow")
        assert not gang.release(session=s, job_id=job.id, attempt=job.attempt, reason="twice")
    assert join(engine, job, "late") is None  # its message arrived after the release
    current = job_row(engine, job.id)
    assert (current.state, current.attempt) == ("queued", 1)
    (released,) = [e for e in job_events(engine, job.id) if e.data.get("cause") == "gang_release"]
    assert released.state_from == "starting" and released.data["joined"] == 1
    assert current.restarts_used == 0 and current.restarts_by_class == {}  # no budget used


def test_exactly_one_node_sees_the_whole_gang_ended(
    engine: Engine, project: ProjectKey, dataset_id: str
) -> None:
    job = claimed_gang(engine, project, dataset_id, nodes=2)
    assert join(engine, job, "w1") == 1
    ends = []
    for rank, completed in ((1, {"final_loss": 1.5}), (0, None)):
        with Session(engine) as s:
            gang.lock_job(s, job.id)
            end = NodeEnd(
                node_rank=rank,
                exit_code=0,
                stop=Stop.SHUTDOWN if rank == 1 else None,
                completed=completed is not None,
            )
            ends.append(
                gang.record_node_end(
                    session=s, job_id=job.id, attempt=job.attempt, end=end, completed=completed
                )
            )
            s.commit()
    assert [len(e) for e in ends] == [1, 2]  # only the last node sees the whole gang ended
    # The last node learns what the other reported: the trainer's completion and its stop.
    assert ends[1] == [
        NodeEnd(node_rank=0, exit_code=0),
        NodeEnd(node_rank=1, exit_code=0, stop=Stop.SHUTDOWN, completed=True),
    ]
    with Session(engine) as s:
        report = gang.completed_report(session=s, job_id=job.id, attempt=job.attempt)
    assert report == {"final_loss": 1.5}


def test_reaper_requeues_a_gang_whose_one_node_went_silent(
    engine: Engine, settings: Settings, project: ProjectKey, dataset_id: str
) -> None:
    spec = tiny_spec(
        pool="gang-reap",
        dataset_id=dataset_id,
        resources={"nodes": 2},
        retries={"max_restarts": 1},
    )
    job_id = create_job(engine, project, spec)
    with Session(engine, expire_on_commit=False) as s:
        job = jobs.claim(session=s, job_id=job_id, worker="w0")
        assert job is not None
        s.commit()
        gang.publish(session=s, job=job, worker="w0", host="127.0.0.1", port=29998)
    assert join(engine, job, "w1") == 1
    long_ago = utcnow() - timedelta(seconds=settings.heartbeat_timeout_s * 3)
    with Session(engine) as s:  # node 1's worker is silent; node 0 still beats the job row
        s.execute(
            update(JobNode)
            .where(JobNode.job_id == job_id, JobNode.node_rank == 1)
            .values(heartbeat_at=long_ago)
        )
        s.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow()))
        s.commit()
    sent: list[tuple[int, str]] = []
    report = reconcile.reconcile(
        settings=settings,
        session_factory=lambda: Session(engine, expire_on_commit=False),
        dispatch=lambda *args: sent.append(args),
        redispatch_after_s=3600,
        pools=["gang-reap"],
    )
    assert report.requeued == [job_id] and sent == [(job_id, "gang-reap")]
    restarting = [e for e in job_events(engine, job_id) if e.state_to == "restarting"]
    assert restarting[0].data["failure_class"] == "node_lost"
    assert job_row(engine, job_id).state == "queued"
