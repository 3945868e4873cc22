"""Jobs with `job_nodes` rows at known times, for the usage tests (API and CLI)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine

from core.platform.db import session_scope
from core.platform.tables import Job, JobNode, JobState
from jobspec.job import parse_job_spec
from tests.conftest import ProjectKey

Node = tuple[int, datetime, datetime | None, int, float]  # attempt, joined, ended, slots, cpu


def make_job(
    engine: Engine,
    project: ProjectKey,
    pool: str,
    nodes: list[Node],
    *,
    state: JobState | None = None,
    heartbeat_at: datetime | None = None,
) -> int:
    """A job of `project` on `pool` whose attempts' nodes held `slots` devices from `joined`
    to `ended` (None: no end recorded) and used `cpu` CPU-seconds; every node last beat at
    `heartbeat_at`. `state`: default `running` when a node has no end, else `succeeded`."""
    if state is None:
        running = any(ended is None for _, _, ended, _, _ in nodes)
        state = JobState.RUNNING if running else JobState.SUCCEEDED
    spec = parse_job_spec(
        {"name": f"job-{pool}", "data": {"uri": "/tmp"}, "resources": {"pool": pool}}
    )
    with session_scope(engine) as s:
        job = Job(
            project_id=project.project_id,
            name=spec.name,
            spec=spec,
            pool=pool,
            max_steps=10,
            state=state,
            attempt=max(n[0] for n in nodes),
        )
        s.add(job)
        s.flush()
        ranks: dict[int, int] = {}
        for attempt, joined, ended, slots, cpu in nodes:
            rank = ranks[attempt] = ranks.get(attempt, -1) + 1
            s.add(
                JobNode(
                    job_id=job.id,
                    attempt=attempt,
                    node_rank=rank,
                    worker="w",
                    joined_at=joined,
                    ended_at=ended,
                    heartbeat_at=heartbeat_at,
                    devices=list(range(slots)),
                    cpu_seconds=cpu,
                )
            )
        return job.id
