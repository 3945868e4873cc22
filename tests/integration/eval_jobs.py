"""Eval jobs (`evaluate`) for tests that show them: a checkpoint row of the source job, and an
eval job's run written through the core services a worker uses (its `evaluation` events as
ingest records them, its `<name>.<metric>` series and a memory sample, all at the one step it
scored, then the end of a completed attempt as the lifecycle decides it). No worker runs it."""

from __future__ import annotations

import time

from sqlalchemy import Engine

from core.attempts.lifecycle_apply import apply, facts_for
from core.attempts.lifecycle_policy import NodeEnd, decide
from core.jobs import evaluations, upserts
from core.jobs import service as jobs
from core.platform.db import session_scope
from core.platform.tables import Checkpoint, Job

MEMORY_BYTES = 1_234_567_890.0  # the worker's one RSS sample of rank 0


def add_checkpoint(engine: Engine, job_id: int, step: int) -> int:
    """A complete checkpoint of job `job_id` at `step` (no files); its id."""
    with session_scope(engine) as session:
        checkpoint = Checkpoint(job_id=job_id, attempt=1, step=step, uri=f"file:///nowhere/{step}")
        session.add(checkpoint)
        session.flush()
        return checkpoint.id


def run_eval_job(
    engine: Engine, job_id: int, step: int, scores: dict[str, dict[str, float]]
) -> None:
    """Make queued eval job `job_id` one that scored `scores` ({evaluation: {metric: value}})
    at `step` and succeeded, as a worker leaves it."""
    now = time.time()
    points = [
        upserts.Metric(f"{name}.{metric}", step, value, now)
        for name, metrics in scores.items()
        for metric, value in metrics.items()
    ]
    points.append(upserts.Metric("sys/rss_bytes/0", step, MEMORY_BYTES, now))
    with session_scope(engine) as session:
        claimed = jobs.claim(session=session, job_id=job_id, worker="w-evals")
        assert claimed is not None, "the job was not queued"
        for name, metrics in scores.items():
            event = {"name": name, "kind": "perplexity", "step": step, "metrics": metrics}
            evaluations.record(session=session, job=claimed, attempt=1, event=event)
        upserts.metrics(session=session, job_id=job_id, attempt=1, points=points)
        row = session.get(Job, job_id, populate_existing=True)
        assert row is not None
        ended = [NodeEnd(node_rank=0, exit_code=0, completed=True)]
        apply(session=session, job=row, decision=decide(facts_for(row, ended=ended)), runtime_s=2.0)
