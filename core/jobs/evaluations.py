"""Eval jobs (`jobspec.job.EvalJobSpec`): their references checked and pinned at submission,
resolved for the worker at launch, and their results recorded and listed.

At submission (`check`) the source job must be a built-in-trainer job of the project with a
complete checkpoint: `{job: ID}` is pinned to its latest one (as `model.init_from` is), so the
eval job scores the weights that existed when it was submitted however long it queues. Each
evaluation's dataset must be of the project and of a format the evaluation reads.

At launch (`launch_inputs`) the worker gets every location the eval program
(`trainer.evaluate`) needs: the checkpoint, the source's own training and evaluation data (its
evaluation split is rebuilt from them), the source's `init_from` checkpoint (the frozen base
of a LoRA run that started from one), and each evaluation's dataset.

The program reports each evaluation as an `evaluation` event; `record` stores it as one
`evaluations` row per eval job and name (a retried attempt replaces it).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from core.datasets import service as datasets
from core.jobs import init_from
from core.platform.db import upsert_insert
from core.platform.errors import Conflict, InvalidInput, NotFound
from core.platform.models import Checkpoint, Dataset, Evaluation, Job, utcnow
from jobspec.evaluate import EvalSourceSpec, GenerateEval
from jobspec.job import EvalJobSpec, JobSpec

LOC = ("body", "evaluate")
GENERATE_FORMATS = ("messages", "prompt_completion")
MAX_SAMPLES = 1000  # answers stored per evaluation (`GenerateEval.max_prompts` allows as many)


def _detail(loc: tuple[str | int, ...], msg: str, kind: str) -> list[dict[str, Any]]:
    return [{"loc": [*LOC, *loc], "msg": msg, "type": kind}]


def check(*, session: Session, project_id: str, spec: EvalJobSpec) -> EvalJobSpec:
    """`spec` with `evaluate.source.checkpoint` pinned (a copy).

    Raises `NotFound` (404) for a source job, checkpoint or dataset not of `project_id`,
    `Conflict` (409) for a source with no complete checkpoint (yet), `InvalidInput` (422) for
    a source that is not a built-in-trainer job, a checkpoint of another job, a dataset of a
    format its evaluation cannot read, or a DPO source's own split (preference pairs) scored
    for perplexity."""
    source = spec.evaluate.source
    job = session.get(Job, source.job)
    if job is None or job.project_id != project_id:
        raise NotFound(
            f"evaluate.source.job: no job {source.job} in this project",
            details=_detail(("source", "job"), "not found", "not_found"),
        )
    if not isinstance(job.spec, JobSpec):
        raise InvalidInput(
            f"evaluate.source.job: job {job.id} is not a built-in-trainer job; only those "
            "have checkpoints an eval job can rebuild",
            details=_detail(("source", "job"), "not a built-in-trainer job", "invalid"),
        )
    checkpoint = _checkpoint(session, job, source)
    _check_evaluations(session, project_id, spec, job.spec)
    pinned = EvalSourceSpec(job=job.id, checkpoint=checkpoint.id)
    evaluate = spec.evaluate.model_copy(update={"source": pinned})
    return spec.model_copy(update={"evaluate": evaluate})


def _checkpoint(session: Session, job: Job, source: EvalSourceSpec) -> Checkpoint:
    if source.checkpoint is None:
        latest = session.execute(
            select(Checkpoint)
            .where(Checkpoint.job_id == job.id)
            .order_by(Checkpoint.step.desc())
            .limit(1)
        ).scalar_one_or_none()
        if latest is None:
            raise Conflict(
                f"evaluate.source.job: job {job.id} ({job.state}) has no complete checkpoint",
                details=_detail(("source", "job"), "no complete checkpoint", "conflict"),
            )
        return latest
    found = session.get(Checkpoint, source.checkpoint)
    owner = None if found is None else session.get(Job, found.job_id)
    if found is None or owner is None or owner.project_id != job.project_id:
        raise NotFound(
            f"evaluate.source.checkpoint: no checkpoint {source.checkpoint} in this project",
            details=_detail(("source", "checkpoint"), "not found", "not_found"),
        )
    if found.job_id != job.id:
        raise InvalidInput(
            f"evaluate.source: checkpoint {found.id} belongs to job {found.job_id}, not job "
            f"{job.id}",
            details=_detail(
                ("source", "checkpoint"), f"a checkpoint of job {found.job_id}", "mismatch"
            ),
        )
    return found


def _check_evaluations(
    session: Session, project_id: str, spec: EvalJobSpec, source: JobSpec
) -> None:
    for index, evaluation in enumerate(spec.evaluate.evaluations):
        loc: tuple[str | int, ...] = ("evaluations", index, "dataset")
        if evaluation.dataset is None:
            if source.method.kind == "dpo":
                raise InvalidInput(
                    f"evaluate.evaluations[{index}]: the source job trains with DPO, its "
                    "evaluation split is preference pairs; give a `dataset` to score",
                    details=_detail(loc, "required for a DPO source", "missing"),
                )
            continue
        found = datasets.get(session=session, dataset_id=evaluation.dataset, project_id=project_id)
        if found is None:
            raise NotFound(
                f"evaluate.evaluations[{index}].dataset: no dataset {evaluation.dataset!r} in "
                "this project",
                details=_detail(loc, "not found", "not_found"),
            )
        if isinstance(evaluation, GenerateEval) and found.format not in GENERATE_FORMATS:
            raise InvalidInput(
                f"evaluate.evaluations[{index}].dataset: {found.id} is {found.format!r}; "
                f"`generate` reads prompts and references of {' or '.join(GENERATE_FORMATS)}",
                details=_detail(loc, f"format {found.format} has no prompts", "invalid"),
            )
        if found.format == "preference":
            raise InvalidInput(
                f"evaluate.evaluations[{index}].dataset: {found.id} is preference pairs; "
                "`perplexity` scores text, tokens, messages or prompt_completion data",
                details=_detail(loc, "preference pairs", "invalid"),
            )


def launch_inputs(*, session: Session, job: Job, spec: EvalJobSpec) -> dict[str, Any]:
    """Every location `trainer.evaluate` reads (its `--inputs` file): `checkpoint` (id, step,
    uri), `source_job`, `source_data`, `source_eval_data`, `source_init_from`, and
    `datasets` ({evaluation name: {id, uri, format}}). Raises `InvalidInput` when the
    checkpoint, the source or a dataset has gone since submission."""
    source = spec.evaluate.source
    checkpoint = session.get(Checkpoint, source.checkpoint) if source.checkpoint else None
    source_job = session.get(Job, source.job)
    if checkpoint is None or source_job is None or not isinstance(source_job.spec, JobSpec):
        raise InvalidInput(
            f"evaluate.source: checkpoint {source.checkpoint} of job {source.job} no longer "
            "exists (deleted by retention or with its job)"
        )
    trained = source_job.spec
    data = trained.data
    located: dict[str, Any] = {
        "checkpoint": {"id": checkpoint.id, "step": checkpoint.step, "uri": checkpoint.uri},
        "source_job": source_job.id,
        "source_data": _dataset(session, job, data.dataset).uri if data.dataset else data.uri,
        "source_eval_data": (
            _dataset(session, job, data.eval_dataset).uri if data.eval_dataset else data.eval_uri
        ),
        "source_init_from": None,
        "datasets": {},
    }
    if trained.model.init_from is not None:
        located["source_init_from"] = init_from.checkpoint_uri(
            session=session, project_id=job.project_id, source=trained.model.init_from
        )
    for evaluation in spec.evaluate.evaluations:
        if evaluation.dataset is not None:
            found = _dataset(session, job, evaluation.dataset)
            located["datasets"][evaluation.name] = {
                "id": found.id,
                "uri": found.uri,
                "format": found.format,
            }
    return located


def _dataset(session: Session, job: Job, dataset_id: str) -> Dataset:
    found = datasets.get(session=session, dataset_id=dataset_id, project_id=job.project_id)
    if found is None:
        raise InvalidInput(f"dataset {dataset_id!r} no longer exists")
    return found


def record(*, session: Session, job: Job, attempt: int, event: dict[str, Any]) -> Evaluation:
    """Store an `evaluation` event of eval job `job` (name, kind, dataset, step, checkpoint,
    metrics, samples), replacing the row an earlier attempt wrote for the same name. Does not
    commit. Raises `ValueError` for an event without a name or of a job with no `evaluate`."""
    spec = job.spec
    if not isinstance(spec, EvalJobSpec):
        raise ValueError(f"job {job.id} is no eval job")
    name = str(event["name"])
    given = dict(event.get("metrics") or {}).items()  # a non-finite score arrives as null
    metrics = {str(k): float(v) for k, v in given if v is not None}
    samples = [dict(s) for s in list(event.get("samples") or [])[:MAX_SAMPLES]]
    values = {
        "job_id": job.id,
        "source_job_id": spec.evaluate.source.job,
        "checkpoint_id": spec.evaluate.source.checkpoint,
        "step": int(event.get("step") or 0),
        "attempt": attempt,
        "name": name,
        "kind": str(event.get("kind") or ""),
        "dataset": event.get("dataset"),
        "metrics": metrics,
        "samples": samples,
        "created_at": utcnow(),
    }
    statement = upsert_insert(session, Evaluation).values(**values)
    changed = {k: statement.excluded[k] for k in values if k not in ("job_id", "name")}
    session.execute(
        statement.on_conflict_do_update(index_elements=["job_id", "name"], set_=changed)
    )
    found = session.execute(
        select(Evaluation).where(Evaluation.job_id == job.id, Evaluation.name == name)
    ).scalar_one()
    return found


def for_job(*, session: Session, job_id: int) -> list[Evaluation]:
    """The evaluations of job `job_id`: the ones it ran (an eval job) and the ones run on its
    checkpoints (a training job), by checkpoint step, then eval job, then name."""
    query = (
        select(Evaluation)
        .where(or_(Evaluation.job_id == job_id, Evaluation.source_job_id == job_id))
        .order_by(Evaluation.step, Evaluation.job_id, Evaluation.id)
    )
    return list(session.execute(query).scalars())
