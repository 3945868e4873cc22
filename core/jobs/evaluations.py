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

A training spec's `eval_after` makes eval jobs itself (`core.submission.eval_after`).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from core.datasets import service as datasets
from core.jobs import init_from
from core.platform.db import upsert_insert
from core.platform.errors import Conflict, InvalidInput, NotFound
from core.platform.settings import Settings
from core.platform.tables import Checkpoint, Dataset, Evaluation, Job, utcnow
from jobspec.evaluate import AnyEvaluation, EvalSourceSpec, GenerateEval, LmEvalEval, RewardEval
from jobspec.job import EvalJobSpec, JobSpec
from jobspec.method_checks import GRPO_FORMATS

LOC = ("body", "evaluate")
GENERATE_FORMATS = ("messages", "prompt_completion")
MAX_SAMPLES = 1000  # answers stored per evaluation (`GenerateEval.max_prompts` allows as many)


def _detail(
    loc: tuple[str | int, ...], msg: str, kind: str, at: tuple[str, ...] = LOC
) -> list[dict[str, Any]]:
    return [{"loc": [*at, *loc], "msg": msg, "type": kind}]


def check(
    *, session: Session, settings: Settings, project_id: str, spec: EvalJobSpec
) -> EvalJobSpec:
    """`spec` with `evaluate.source.checkpoint` pinned and each dataset named by its id (a
    copy).

    Raises `NotFound` (404) for a source job, checkpoint or dataset not of `project_id`,
    `Conflict` (409) for a source with no complete checkpoint (yet), `InvalidInput` (422) for
    a source that is not a built-in-trainer job, a checkpoint of another job, a dataset of a
    format its evaluation cannot read, a DPO or GRPO source's own split (preference pairs,
    prompts) scored for perplexity, or a `reward` evaluation the source cannot give its
    prompts, graders or room for (`RewardEval.source_errors`)."""
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
    evaluations = _check_evaluations(
        session, settings, project_id, spec.evaluate.evaluations, job.spec, LOC
    )
    pinned = source
    if not source.initial:
        checkpoint = _checkpoint(session, job, source)
        pinned = EvalSourceSpec(job=job.id, checkpoint=checkpoint.id)
    evaluate = spec.evaluate.model_copy(update={"source": pinned, "evaluations": evaluations})
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
    session: Session,
    settings: Settings,
    project_id: str,
    evaluations: list[AnyEvaluation],
    source: JobSpec,
    at: tuple[str, ...],
) -> list[AnyEvaluation]:
    """Each evaluation's dataset is of the project and of a format it reads (`at`: where the
    list sits in the request, for the errors' paths). Returns the evaluations with each
    dataset named by its id (a name is pinned to the dataset it names now)."""
    where = ".".join(at[1:])
    pinned: list[AnyEvaluation] = []
    for index, evaluation in enumerate(evaluations):
        if isinstance(evaluation, LmEvalEval):
            where_tasks: tuple[str | int, ...] = (*at, "evaluations", index)
            pinned.append(_check_tasks(session, settings, project_id, evaluation, where_tasks))
            continue
        if isinstance(evaluation, RewardEval):
            _check_reward(evaluation, source, index, at)
        loc: tuple[str | int, ...] = ("evaluations", index, "dataset")
        if evaluation.dataset is None:
            kind = source.method.kind
            if not isinstance(evaluation, RewardEval) and kind in ("dpo", "grpo"):
                split = "preference pairs" if kind == "dpo" else "prompts, with no answers"
                instead = "" if kind == "dpo" else " (or evaluate its rewards: kind `reward`)"
                raise InvalidInput(
                    f"{where}.evaluations[{index}]: the source job trains with "
                    f"{kind.upper()}, its evaluation split is {split}; give a `dataset` to "
                    f"score{instead}",
                    details=_detail(loc, f"required for a {kind.upper()} source", "missing", at),
                )
            pinned.append(evaluation)
            continue
        found = datasets.get(session=session, dataset_id=evaluation.dataset, project_id=project_id)
        if found is None:
            raise NotFound(
                f"{where}.evaluations[{index}].dataset: no dataset {evaluation.dataset!r} in "
                "this project",
                details=_detail(loc, "not found", "not_found", at),
            )
        if isinstance(evaluation, GenerateEval) and found.format not in GENERATE_FORMATS:
            raise InvalidInput(
                f"{where}.evaluations[{index}].dataset: {found.id} is {found.format!r}; "
                f"`generate` reads prompts and references of {' or '.join(GENERATE_FORMATS)}",
                details=_detail(loc, f"format {found.format} has no prompts", "invalid", at),
            )
        if isinstance(evaluation, RewardEval) and found.format not in GRPO_FORMATS:
            raise InvalidInput(
                f"{where}.evaluations[{index}].dataset: {found.id} is {found.format!r}; "
                f"`reward` reads the prompts of {', '.join(GRPO_FORMATS)} records",
                details=_detail(loc, f"format {found.format} has no prompts", "invalid", at),
            )
        if found.format == "preference":
            raise InvalidInput(
                f"{where}.evaluations[{index}].dataset: {found.id} is preference pairs; "
                "`perplexity` scores text, tokens, messages or prompt_completion data",
                details=_detail(loc, "preference pairs", "invalid", at),
            )
        pinned.append(evaluation.model_copy(update={"dataset": found.id}))
    return pinned


def _check_reward(evaluation: RewardEval, source: JobSpec, index: int, at: tuple[str, ...]) -> None:
    """Raises `InvalidInput` (422) listing every `RewardEval.source_errors` at its path."""
    errors = evaluation.source_errors(source.method.grpo, source.model.seq_len)
    if not errors:
        return
    where = ".".join(at[1:])
    raise InvalidInput(
        "; ".join(f"{where}.evaluations[{index}].{'.'.join(loc)}: {msg}" for loc, msg in errors),
        details=[
            {"loc": [*at, "evaluations", index, *loc], "msg": msg, "type": "invalid"}
            for loc, msg in errors
        ],
    )


def check_after(*, session: Session, settings: Settings, project_id: str, spec: JobSpec) -> JobSpec:
    """`spec` with its `eval_after` datasets named by id, after checking they exist in the
    project and fit their evaluations. Raises `NotFound` (404) or `InvalidInput` (422) at
    `body.eval_after...`."""
    if spec.eval_after is None:
        return spec
    evaluations = _check_evaluations(
        session, settings, project_id, spec.eval_after.evaluations, spec, ("body", "eval_after")
    )
    after = spec.eval_after.model_copy(update={"evaluations": evaluations})
    return spec.model_copy(update={"eval_after": after})


def _check_tasks(
    session: Session,
    settings: Settings,
    project_id: str,
    evaluation: LmEvalEval,
    at: tuple[str | int, ...],
) -> LmEvalEval:
    """An inline task's dataset is of the project and holds records (not tokens); a named
    task is one of the server's local tasks (`settings.lm_eval_task_dirs`). Returns
    `evaluation` with each inline task's dataset named by its id."""
    tasks: list[str | dict[str, Any]] = []
    for index, task in enumerate(evaluation.tasks):
        loc = (*at, "tasks", index)
        if isinstance(task, str):
            if task not in local_tasks(tuple(settings.lm_eval_task_dirs)):
                raise InvalidInput(
                    f"lm_eval task {task!r} is not one of this server's local tasks "
                    "(TORCHYARD_LM_EVAL_TASK_DIRS); lm-eval's own tasks read the Hugging Face "
                    "hub, which workers do not reach: describe the task inline with a dataset "
                    "of the project",
                    details=[
                        {"loc": list(loc), "msg": f"no local task {task!r}", "type": "invalid"}
                    ],
                )
            tasks.append(task)
            continue
        dataset_id = str(task["dataset"])
        found = datasets.get(session=session, dataset_id=dataset_id, project_id=project_id)
        if found is None or found.format == "tokens":
            why = "not found" if found is None else "token ids, not records"
            error = NotFound if found is None else InvalidInput
            raise error(
                f"lm_eval task {task['task']!r}: dataset {dataset_id!r}: {why}",
                details=[{"loc": [*loc, "dataset"], "msg": why, "type": "invalid"}],
            )
        tasks.append({**task, "dataset": found.id})
    return evaluation.model_copy(update={"tasks": tasks})


@functools.lru_cache(maxsize=8)
def local_tasks(dirs: tuple[str, ...]) -> frozenset[str]:
    """The task (and group) names lm-eval's `TaskManager` finds in `dirs` (its own tasks
    left out); empty without `dirs` or without lm-eval installed. Cached per process."""
    if not dirs:
        return frozenset()
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:  # an API host without the trainer's packages: no names to offer
        return frozenset()
    return frozenset(TaskManager(include_path=list(dirs), include_defaults=False).all_tasks)


def launch_inputs(
    *, session: Session, settings: Settings, job: Job, spec: EvalJobSpec
) -> dict[str, Any]:
    """Every location `trainer.evaluate` reads (its `--inputs` file): `checkpoint` (id, step,
    uri; null for `source.initial`), `source_spec` (the source job's spec, for
    `source.initial`), `source_job`, `source_data`, `source_eval_data`, `source_init_from`,
    `source_model` (a Hugging Face `path_or_id`), `source_grader_code` (the source GRPO job's
    `method.grpo.code`, whose files its python graders read), `datasets` ({evaluation name:
    {id, uri, format}}), `task_datasets` ({dataset id: {id, uri}}: `lm_eval`'s inline tasks) and
    `lm_eval_task_dirs` (this worker's `settings.lm_eval_task_dirs`). Raises `InvalidInput`
    when the checkpoint, the source or a dataset has gone since submission."""
    source = spec.evaluate.source
    checkpoint = session.get(Checkpoint, source.checkpoint) if source.checkpoint else None
    source_job = session.get(Job, source.job)
    if (
        (checkpoint is None and not source.initial)
        or source_job is None
        or not isinstance(source_job.spec, JobSpec)
    ):
        raise InvalidInput(
            f"evaluate.source: checkpoint {source.checkpoint} of job {source.job} no longer "
            "exists (deleted by retention or with its job)"
        )
    trained = source_job.spec
    data = trained.data
    located: dict[str, Any] = {
        "checkpoint": (
            None
            if checkpoint is None
            else {"id": checkpoint.id, "step": checkpoint.step, "uri": checkpoint.uri}
        ),
        # the starting weights are built from the job's own spec (a checkpoint carries its own)
        "source_spec": trained.model_dump(mode="json") if source.initial else None,
        "source_job": source_job.id,
        "source_data": _dataset(session, job, data.dataset).uri if data.dataset else data.uri,
        "source_eval_data": (
            _dataset(session, job, data.eval_dataset).uri if data.eval_dataset else data.eval_uri
        ),
        "source_init_from": None,
        # the source GRPO job's code archive (its python graders' files), for `reward`
        "source_grader_code": trained.method.grpo.code if trained.method.grpo else None,
        # a Hugging Face source's files (a local directory or a hub id) the model is built from
        "source_model": trained.model.hf.path_or_id if trained.model.hf else None,
        "datasets": {},
        "task_datasets": {},  # {dataset id: {id, uri}}: what `lm_eval`'s inline tasks read
        "lm_eval_task_dirs": list(settings.lm_eval_task_dirs),
    }
    if trained.model.init_from is not None:
        located["source_init_from"] = init_from.checkpoint_uri(
            session=session, project_id=job.project_id, source=trained.model.init_from
        )
    for evaluation in spec.evaluate.evaluations:
        if isinstance(evaluation, LmEvalEval):
            for dataset_id in evaluation.datasets():
                found = _dataset(session, job, dataset_id)
                located["task_datasets"][found.id] = {"id": found.id, "uri": found.uri}
        elif evaluation.dataset is not None:
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
