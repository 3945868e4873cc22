"""Fine-tuning from an earlier job's checkpoint (`model.init_from`): resolve and pin it.

At submission (`pin`) the source is checked against the submitting project and pinned: a
`{job: ID}` gets the id of that job's latest complete checkpoint, so the new job starts from
the weights that existed when it was submitted, however long it waits in the queue. At launch
the worker turns the pinned id into the checkpoint's URI (`checkpoint_uri`) and passes it to
the trainer (`--init-from`, docs/CONTRACTS.md section 1).

A `checkpoints` row exists exactly while its checkpoint is complete and kept (retention deletes
the row with the files), so "complete checkpoint" here is "row present".
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.platform.errors import Conflict, InvalidInput, NotFound
from core.platform.tables import Checkpoint, Job
from jobspec.job import STORED, InitFromSpec, JobSpec

LOC = ("body", "model", "init_from")
# Fields that do not change the shapes of the weights.
_SHAPELESS = {"init_from", "dropout"}


def _detail(field: str, msg: str, kind: str) -> list[dict[str, Any]]:
    return [{"loc": [*LOC, field], "msg": msg, "type": kind}]


def pin(*, session: Session, project_id: str, spec: JobSpec) -> JobSpec:
    """`spec` with `model.init_from.checkpoint` set (a copy), or `spec` itself without one.

    Raises `NotFound` (404) for a job or checkpoint that is not of `project_id`, `Conflict`
    (409) for a job with no complete checkpoint (yet), `InvalidInput` (422) for a checkpoint
    of another job than `job`, or a source whose model has other shapes than this spec's.
    """
    source = spec.model.init_from
    if source is None:
        return spec
    if source.checkpoint is not None:
        found = checkpoint_of_project(session, project_id, source.checkpoint)
        if found is None:
            raise NotFound(
                f"model.init_from.checkpoint: no checkpoint {source.checkpoint} in this project",
                details=_detail("checkpoint", "not found", "not_found"),
            )
        checkpoint, job = found
        if source.job is not None and source.job != job.id:
            raise InvalidInput(
                f"model.init_from: checkpoint {checkpoint.id} belongs to job {job.id}, "
                f"not job {source.job}",
                details=_detail("checkpoint", f"a checkpoint of job {job.id}", "mismatch"),
            )
    else:
        assert source.job is not None  # InitFromSpec asks for one of the two
        job = _job_of_project(session, project_id, source.job)
        newest = latest(session, job.id)
        if newest is None:
            raise Conflict(
                f"model.init_from.job: job {job.id} ({job.state}) has no complete checkpoint",
                details=_detail("job", "no complete checkpoint", "conflict"),
            )
        checkpoint = newest
    _check_shapes(spec, job)
    pinned = InitFromSpec(job=job.id, checkpoint=checkpoint.id)
    return spec.model_copy(update={"model": spec.model.model_copy(update={"init_from": pinned})})


def checkpoint_uri(*, session: Session, project_id: str, source: InitFromSpec) -> str:
    """The URI of the pinned checkpoint `source.checkpoint` (or, for a spec stored without
    one, the latest of `source.job`). Raises `InvalidInput` when it no longer exists."""
    if source.checkpoint is not None:
        found = checkpoint_of_project(session, project_id, source.checkpoint)
        checkpoint = found[0] if found else None
    else:
        assert source.job is not None
        checkpoint = latest(session, source.job)
    if checkpoint is None:
        raise InvalidInput(
            f"model.init_from: checkpoint {source.checkpoint or '(latest)'} of job "
            f"{source.job} no longer exists (deleted by retention or with its job)"
        )
    return checkpoint.uri


def launch_uri(
    *, session: Session, job_id: int, project_id: str, source: InitFromSpec
) -> str | None:
    """What the worker passes as `--init-from` for job `job_id`: the pinned checkpoint's URI;
    None when that is gone but the job has checkpoints of its own (the trainer resumes from
    those and would ignore it). Raises `InvalidInput` when neither exists."""
    try:
        return checkpoint_uri(session=session, project_id=project_id, source=source)
    except InvalidInput:
        own = select(Checkpoint.id).where(Checkpoint.job_id == job_id).limit(1)
        if session.scalar(own) is not None:
            return None
        raise


def _job_of_project(session: Session, project_id: str, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None or job.project_id != project_id:
        raise NotFound(
            f"model.init_from.job: no job {job_id} in this project",
            details=_detail("job", "not found", "not_found"),
        )
    return job


def checkpoint_of_project(
    session: Session, project_id: str, checkpoint_id: int
) -> tuple[Checkpoint, Job] | None:
    """Checkpoint `checkpoint_id` and its job, when that job is of `project_id`; else None."""
    row = session.execute(
        select(Checkpoint, Job)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id == checkpoint_id, Job.project_id == project_id)
    ).first()
    return (row[0], row[1]) if row else None


def latest(session: Session, job_id: int) -> Checkpoint | None:
    """The job's complete checkpoint of the highest step (a row exists exactly while one is
    complete and kept); also `entrypoint.inputs`' `{job: N}` (`core.jobs.inputs`)."""
    return session.execute(
        select(Checkpoint)
        .where(Checkpoint.job_id == job_id)
        .order_by(Checkpoint.step.desc())
        .limit(1)
    ).scalar_one_or_none()


def _shapes(spec: JobSpec) -> dict[str, Any]:
    model = spec.model.model_dump(mode="json", exclude=_SHAPELESS)
    if model.get("kind") == "gpt" and model.get("d_ff") is None:
        model["d_ff"] = 4 * model["d_model"]
    return model


def _check_shapes(spec: JobSpec, source: Job) -> None:
    """The weights of `source` fit `spec`'s model: the same architecture fields."""
    try:
        theirs = _shapes(JobSpec.model_validate(source.spec, context=STORED))
    except ValidationError:  # a spec stored under older rules: the trainer checks shapes
        return
    ours = _shapes(spec)
    diff = {k: (theirs.get(k), ours.get(k)) for k in ours.keys() | theirs.keys()}
    diff = {k: v for k, v in diff.items() if v[0] != v[1]}
    if diff:
        said = ", ".join(f"{k}: {a} there, {b} here" for k, (a, b) in sorted(diff.items()))
        raise InvalidInput(
            f"model.init_from: job {source.id}'s model has other shapes ({said})",
            details=[{"loc": list(LOC), "msg": f"model differs: {said}", "type": "mismatch"}],
        )
