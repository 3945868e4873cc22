"""Every attempt is a gang of N >= 1 nodes (`resources.nodes`): node slots, assembly, the end.

An attempt has one `job_nodes` row per node (one for a single-node job). The worker that
claims the job (the fencing `queued -> starting` UPDATE of `core.jobs.service.claim`) is node 0: it
creates the rows, takes slot 0 and publishes the rendezvous endpoint (its advertised host and
a free port) on it, then sends one join message per other node to the pool's queue (none when
N = 1). A joining worker takes the lowest free slot with a fencing UPDATE (`worker IS NULL`),
so a duplicated join message finds no slot and does nothing. Once every slot is taken the gang
is *assembled*: each node launches its own torchrun (`--nnodes N`, c10d rendezvous at node
0's endpoint).

A gang that does not assemble within `gang_assemble_timeout_s` is released (`release`):
starting -> queued without using the restart budget, so a pool with fewer free workers than
the gang needs never deadlocks; the job runs once enough workers are free.

Every decision here (join, release, a node's end) first locks the job row (`SELECT ... FOR
UPDATE` on Postgres), so joins, the release and the final verdict are serialised per job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from core.attempts.lifecycle_policy import Failure, NodeEnd, Stop
from core.jobs import service as jobs
from core.platform.tables import Job, JobNode, JobState, utcnow


def num_nodes(job: Job) -> int:
    """`resources.nodes` of the job."""
    return job.spec.resources.nodes


def lock_job(session: Session, job_id: int) -> Job | None:
    """The job row, locked (`SELECT ... FOR UPDATE`) until the transaction ends."""
    return session.execute(
        select(Job)
        .where(Job.id == job_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def _is_current(job: Job | None, attempt: int, states: Sequence[str]) -> bool:
    return job is not None and job.attempt == attempt and job.state in states


def publish(*, session: Session, job: Job, worker: str, host: str, port: int) -> None:
    """Create the node slots of the claimed attempt; slot 0 is `worker`'s with the rendezvous
    endpoint `host:port`. Commits."""
    now = utcnow()
    nodes = num_nodes(job)
    for rank in range(nodes):
        leader = rank == 0
        session.add(
            JobNode(
                job_id=job.id,
                attempt=job.attempt,
                node_rank=rank,
                worker=worker if leader else None,
                host=host if leader else None,
                port=port if leader else None,
                joined_at=now if leader else None,
                heartbeat_at=now if leader else None,
            )
        )
    if nodes == 1:  # nothing to wait for
        session.commit()
        return
    jobs.add_event(
        session=session,
        job=job,
        kind="info",
        message=f"gang of {nodes} nodes: node 0 is {worker}, rendezvous at {host}:{port}; "
        f"waiting for {nodes - 1} more",
        data={"nodes": nodes, "node_rank": 0, "worker": worker, "endpoint": f"{host}:{port}"},
    )
    session.commit()


def join(*, session: Session, job_id: int, attempt: int, worker: str, host: str) -> int | None:
    """Take the lowest free node slot of attempt `attempt`; returns its node rank, or None when
    the attempt is over, released or already full (a duplicate or late join message). Commits.
    """
    job = lock_job(session, job_id)
    if not _is_current(job, attempt, [JobState.STARTING]):
        session.rollback()
        return None
    assert job is not None
    free = session.execute(
        select(JobNode.node_rank)
        .where(JobNode.job_id == job_id, JobNode.attempt == attempt, JobNode.worker.is_(None))
        .order_by(JobNode.node_rank)
        .limit(1)
    ).scalar_one_or_none()
    if free is None:
        session.rollback()
        return None
    now = utcnow()
    taken = session.execute(
        update(JobNode)
        .where(
            JobNode.job_id == job_id,
            JobNode.attempt == attempt,
            JobNode.node_rank == free,
            JobNode.worker.is_(None),
        )
        .values(worker=worker, host=host, joined_at=now, heartbeat_at=now)
        .execution_options(synchronize_session=False)
    )
    if taken.rowcount != 1:  # type: ignore[attr-defined]
        session.rollback()
        return None
    jobs.add_event(
        session=session,
        job=job,
        kind="info",
        message=f"node {free} joined the gang: {worker}",
        data={"node_rank": free, "worker": worker, "host": host},
    )
    session.commit()
    return int(free)


def record_devices(*, session: Session, job: Job, node_rank: int, devices: Sequence[int]) -> None:
    """Record the device indices node `node_rank` of the job's current attempt was given, on
    its slot (every attempt has one slot per node, `publish`). Does not commit."""
    session.execute(
        update(JobNode)
        .where(
            JobNode.job_id == job.id,
            JobNode.attempt == job.attempt,
            JobNode.node_rank == node_rank,
        )
        .values(devices=list(devices))
        .execution_options(synchronize_session=False)
    )


def members(*, session: Session, job_id: int, attempt: int) -> list[JobNode]:
    """The node slots of one attempt, by node rank."""
    query = (
        select(JobNode)
        .where(JobNode.job_id == job_id, JobNode.attempt == attempt)
        .order_by(JobNode.node_rank)
        .execution_options(populate_existing=True)
    )
    return list(session.execute(query).scalars())


def assembled(nodes: Sequence[JobNode]) -> bool:
    return bool(nodes) and all(n.worker is not None for n in nodes)


def release(*, session: Session, job_id: int, attempt: int, reason: str) -> bool:
    """Give up assembling: starting -> queued (no restart budget used). Commits.

    False, changing nothing, when the gang assembled meanwhile or the attempt is no longer
    starting (cancelled, reaped, ...).
    """
    job = lock_job(session, job_id)
    if not _is_current(job, attempt, [JobState.STARTING]):
        session.rollback()
        return False
    slots = members(session=session, job_id=job_id, attempt=attempt)
    if assembled(slots):
        session.rollback()
        return False
    joined = sum(1 for n in slots if n.worker is not None)
    jobs.transition(
        session=session,
        job_id=job_id,
        to=JobState.QUEUED,
        from_states=[JobState.STARTING],
        message=f"{reason}; released the {joined} node(s) that joined, back to the queue",
        data={"cause": "gang_release", "attempt": attempt, "joined": joined, "nodes": len(slots)},
    )
    session.commit()
    return True


@dataclass(frozen=True)
class Beat:
    """What a node's heartbeat learned: the job's `state` (None when the attempt is no
    longer active: reaped, re-claimed, ended) and `peer_stop`, another node's stop reason."""

    state: str | None
    peer_stop: str | None


def heartbeat(
    *, session: Session, job_id: int, attempt: int, node_rank: int, stop: str | None = None
) -> Beat:
    """Record that node `node_rank` of attempt `attempt` is alive: its slot, and for node 0
    also the job row (the reconciler watches both). `stop`: why this node's worker is stopping
    its trainer (shutdown, max_runtime), for the other nodes to follow. Does not commit."""
    values: dict[str, Any] = {"heartbeat_at": utcnow()}
    if stop is not None:
        values["stop"] = stop
    session.execute(
        update(JobNode)
        .where(
            JobNode.job_id == job_id,
            JobNode.attempt == attempt,
            JobNode.node_rank == node_rank,
            JobNode.ended_at.is_(None),
        )
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    current = (Job.id == job_id) & (Job.attempt == attempt) & Job.state.in_(jobs.ACTIVE_STATES)
    if node_rank == 0:
        state = session.execute(
            update(Job)
            .where(current)
            .values(heartbeat_at=utcnow())
            .returning(Job.state)
            .execution_options(synchronize_session=False)
        ).scalar_one_or_none()
    else:
        state = session.execute(select(Job.state).where(current)).scalar_one_or_none()
    peer_stop = session.execute(
        select(JobNode.stop)
        .where(
            JobNode.job_id == job_id,
            JobNode.attempt == attempt,
            JobNode.node_rank != node_rank,
            JobNode.stop.is_not(None),
        )
        .limit(1)
    ).scalar_one_or_none()
    return Beat(state=state, peer_stop=peer_stop)


def record_node_end(
    *,
    session: Session,
    job_id: int,
    attempt: int,
    end: NodeEnd,
    completed: dict[str, Any] | None = None,
) -> list[NodeEnd]:
    """Record how node `end.node_rank` of attempt `attempt` ended on its slot (`completed`: the
    trainer's `completed` report, when this node's rank made it); returns the ends of every
    node of the attempt that has ended, this one included, by node rank.

    The caller locks the job row first (`lock_job`), so exactly one node sees them all, and
    decides and applies the attempt's end in the same transaction. Does not commit.
    """
    session.execute(
        update(JobNode)
        .where(
            JobNode.job_id == job_id,
            JobNode.attempt == attempt,
            JobNode.node_rank == end.node_rank,
        )
        .values(
            ended_at=utcnow(),
            exit_code=end.exit_code,
            stop=None if end.stop is None else str(end.stop),
            completed=completed,
            failure=None if end.failure is None else end.failure.to_json(),
        )
        .execution_options(synchronize_session=False)
    )
    slots = members(session=session, job_id=job_id, attempt=attempt)
    return [node_end(n) for n in slots if n.ended_at is not None]


def node_end(slot: JobNode) -> NodeEnd:
    """A `NodeEnd` from an ended node's slot (`completed` says whether it reported completion;
    the report itself stays on the slot)."""
    return NodeEnd(
        node_rank=slot.node_rank,
        exit_code=slot.exit_code or 0,
        stop=None if slot.stop is None else Stop(slot.stop),
        completed=slot.completed is not None,
        failure=None if slot.failure is None else Failure.from_json(slot.failure),
    )


def completed_report(*, session: Session, job_id: int, attempt: int) -> dict[str, Any] | None:
    """The trainer's `completed` report of the attempt, from whichever node's rank made it."""
    slots = members(session=session, job_id=job_id, attempt=attempt)
    return next((n.completed for n in slots if n.completed is not None), None)
