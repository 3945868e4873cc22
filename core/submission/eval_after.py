"""The eval jobs a training spec's `eval_after` makes: `after_checkpoint` (every k-th periodic
checkpoint, as ingest records it) and `after_success` (the final checkpoint, when the job
succeeds), each with the baseline (`source.initial`: the starting weights) the first time.

They go through the one door (`core.submission.service.submit`, door `EVAL_AFTER`): in the
caller's transaction (the checkpoint's record, the success), keyed `eval-after-<job>-<step|
initial>` so a replay makes none twice, and sent after its commit by the session's dispatch
(`core.jobs.outbox`). Their specs were checked with the training spec's (`evaluations.
check_after`), and an evaluation owed to a finished run is not refused by a queue quota.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.tables import Checkpoint, Job
from core.submission import service as submission
from jobspec.evaluate import EvalSourceSpec, EvaluateSpec
from jobspec.job import EvalJobSpec, JobSpec, ResourcesSpec


def after_checkpoint(*, session: Session, job: Job, checkpoint: Checkpoint) -> list[Job]:
    """The eval jobs a newly recorded periodic checkpoint of `job` starts (`eval_after.
    every_checkpoints`: steps that are multiples of k x `checkpoint.interval_steps`), with the
    baseline's (`eval_after.baseline`) the first time. Idempotent; does not commit."""
    spec = job.spec
    if not isinstance(spec, JobSpec) or spec.eval_after is None:
        return []
    after = spec.eval_after
    if after.every_checkpoints is None:
        return []
    if checkpoint.step % (after.every_checkpoints * spec.checkpoint.interval_steps):
        return []
    return _queue(session, job, checkpoint)


def after_success(*, session: Session, job: Job) -> list[Job]:
    """The eval jobs `job`'s success starts (`eval_after`): its final checkpoint's, and the
    baseline's unless queued already. Idempotent; does not commit."""
    if not isinstance(job.spec, JobSpec) or job.spec.eval_after is None:
        return []
    final = session.execute(
        select(Checkpoint)
        .where(Checkpoint.job_id == job.id)
        .order_by(Checkpoint.step.desc())
        .limit(1)
    ).scalar_one_or_none()
    if final is None:  # a run that saved nothing: only the baseline has weights to score
        return _queue(session, job, None) if job.spec.eval_after.baseline else []
    return _queue(session, job, final)


def _queue(session: Session, job: Job, checkpoint: Checkpoint | None) -> list[Job]:
    spec = job.spec
    assert isinstance(spec, JobSpec) and spec.eval_after is not None
    after = spec.eval_after
    sources: list[tuple[str, EvalSourceSpec]] = []
    if checkpoint is not None:
        pinned = EvalSourceSpec(job=job.id, checkpoint=checkpoint.id)
        sources.append((str(checkpoint.step), pinned))
    if after.baseline:
        sources.append(("initial", EvalSourceSpec(job=job.id, initial=True)))
    queued = []
    for at, source in sources:
        key = f"eval-after-{job.id}-{at}"
        if jobs.by_idempotency_key(session, job.project_id, key) is not None:
            continue
        evaluation = EvalJobSpec(
            name=f"{job.name}-eval-{at}"[:100],
            labels={"eval_of": str(job.id), "eval_at": at},
            seed=spec.seed,
            resources=ResourcesSpec(
                procs_per_node=after.procs_per_node,
                device=spec.resources.device,
                pool=spec.resources.pool,
            ),
            priority=spec.priority,
            evaluate=EvaluateSpec(source=source, evaluations=after.evaluations),
        )
        what = "starting weights" if at == "initial" else f"step {at}"
        message = f"eval_after of job {job.id} ({what})"
        made = submission.submit(
            session=session,
            settings=None,
            project_id=job.project_id,
            spec=evaluation,
            owner=job.owner,
            idempotency_key=key,
            door=submission.EVAL_AFTER,
            message=message,
        )
        queued.append(made.job)
    return queued
