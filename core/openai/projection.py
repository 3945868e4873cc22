"""The OpenAI-compatible view (`/openai/v1`): a projection of datasets and jobs, not a store.

A file is a dataset (its id is the dataset's), a fine-tuning job is a Torchyard job labelled
`openai.base` (id `ftjob-<job id>`), a fine-tuned model is a succeeded one of them
(`ft:<base>:<project>:<suffix>:<job id>`). The shapes follow OpenAI's documented objects.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, func, select, type_coerce
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.openai.results import result_file_id, trained_tokens
from core.platform.errors import InvalidInput, NotFound
from core.platform.settings import BaseModelEntry, Settings
from core.platform.tables import (
    Checkpoint,
    Dataset,
    Evaluation,
    Job,
    JobEvent,
    JobState,
    MetricPoint,
)
from jobspec.job import JobSpec

JOB_PREFIX = "ftjob-"
EVENT_PREFIX = "ftevent-"
CHECKPOINT_PREFIX = "ftckpt-"
BASE_LABEL = "openai.base"
FULL_VALID = "full_valid"  # the eval_after evaluation behind `full_valid_loss`
SUFFIX_LABEL = "openai.suffix"
# A continued fine-tune's `model` as given (`ft:...` of the job it starts from); its base model
# is BASE_LABEL's, which names the fine-tuned model it makes
MODEL_LABEL = "openai.model"
LR_LABEL = "openai.lr_multiplier"
COMPUTE_LABEL = "openai.compute_multiplier"  # a reinforcement job's, as given (or 1.0)
META_PREFIX = "openai.meta."

STATUS = {
    JobState.QUEUED: "queued",
    JobState.STARTING: "running",
    JobState.RUNNING: "running",
    JobState.RESTARTING: "running",
    JobState.PAUSING: "running",
    JobState.PREEMPTING: "running",
    JobState.CANCELLING: "running",
    JobState.PAUSED: "paused",
    JobState.SUCCEEDED: "succeeded",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
    JobState.PRUNED: "cancelled",  # OpenAI's statuses have no such word
}


def ts(when: datetime | None) -> int | None:
    """Unix seconds of a stored (naive UTC or aware) time."""
    if when is None:
        return None
    aware = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    return int(aware.timestamp())


def base_model(settings: Settings, name: str, param: str = "model") -> BaseModelEntry:
    """The registered base model `name`. Raises InvalidInput naming `param`."""
    entry = settings.base_models.get(name)
    if entry is None:
        raise InvalidInput(
            f"{param}: no base model {name!r} (GET /openai/v1/models lists them)",
            details=[{"loc": ["body", param], "msg": "unknown model", "type": "model_not_found"}],
        )
    return entry


def file_object(dataset: Dataset) -> dict[str, Any]:
    """A dataset as an OpenAI `file` object."""
    return {
        "id": dataset.id,
        "object": "file",
        "bytes": dataset.size_bytes,
        "created_at": ts(dataset.created_at),
        "filename": dataset.name,
        "purpose": "fine-tune",
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def is_fine_tune(job: Job) -> bool:
    return BASE_LABEL in (job.labels or {}) and isinstance(job.spec, JobSpec)


def model_name(job: Job) -> str:
    """`ft:<base>:<project>:<suffix>:<job id>` (suffix empty when none was given)."""
    labels = job.labels or {}
    return f"ft:{labels[BASE_LABEL]}:{job.project_id}:{labels.get(SUFFIX_LABEL, '')}:{job.id}"


def parse_job_id(raw: str) -> int:
    """The Torchyard job id of `ftjob-<id>`. Raises NotFound for anything else."""
    digits = raw.removeprefix(JOB_PREFIX)
    if not raw.startswith(JOB_PREFIX) or not digits.isdigit() or len(digits) > 18:
        raise NotFound(f"fine-tuning job {raw[:100]!r} not found")
    return int(digits)


def get_job(session: Session, raw_id: str, project_id: str) -> Job:
    """The fine-tuning job `ftjob-<id>` of the project. Raises NotFound (404)."""
    job = jobs.get(session=session, job_id=parse_job_id(raw_id), project_id=project_id)
    if job is None or not is_fine_tune(job):
        raise NotFound(f"fine-tuning job {raw_id[:100]!r} not found")
    return job


# `method.type` of a Torchyard `method.kind`.
METHOD_TYPES = {"sft": "supervised", "dpo": "dpo", "grpo": "reinforcement"}
COMMON_HYPERPARAMETERS = ("n_epochs", "batch_size", "learning_rate_multiplier")


def hyperparameters(job: Job) -> dict[str, Any]:
    """The resolved hyperparameters of a fine-tuning job's method (from its spec and labels):
    the common three, DPO's `beta`, and reinforcement's `compute_multiplier`, `eval_interval`,
    `eval_samples` (held-out prompts per evaluation and data-parallel process) and
    `reasoning_effort`."""
    spec = job.spec
    assert isinstance(spec, JobSpec)
    labels = job.labels or {}
    batch = spec.train.micro_batch_size * spec.train.grad_accum_steps
    out: dict[str, Any] = {
        "n_epochs": spec.train.epochs,
        "batch_size": batch,
        "learning_rate_multiplier": float(labels.get(LR_LABEL, "1.0")),
    }
    if spec.method.kind == "dpo" and spec.method.dpo is not None:
        out["beta"] = spec.method.dpo.beta
    if spec.method.kind == "grpo":
        out["compute_multiplier"] = float(labels.get(COMPUTE_LABEL, "1.0"))
        out["eval_interval"] = spec.eval.interval_steps
        out["eval_samples"] = spec.eval.num_batches * spec.train.micro_batch_size
        out["reasoning_effort"] = "default"
    return out


def method_object(job: Job) -> dict[str, Any]:
    """The job's `method` as OpenAI shows it: `{"type", <type>: {"hyperparameters"}}`, with a
    reinforcement job's `grader` (its spec's one grader)."""
    spec = job.spec
    assert isinstance(spec, JobSpec)
    kind = METHOD_TYPES.get(spec.method.kind, "supervised")
    settings: dict[str, Any] = {"hyperparameters": hyperparameters(job)}
    if spec.method.grpo is not None and spec.method.grpo.graders:
        settings["grader"] = spec.method.grpo.graders[0].model_dump(mode="json", exclude_none=True)
    return {"type": kind, kind: settings}


def _estimated_finish(job: Job) -> int | None:
    started, step = ts(job.started_at), job.current_step or 0
    if job.state != JobState.RUNNING or started is None or step <= 0 or job.max_steps <= step:
        return None
    elapsed = datetime.now(UTC).timestamp() - started
    return int(started + elapsed * job.max_steps / step)


def job_objects(session: Session, found: list[Job]) -> list[dict[str, Any]]:
    """`job_object` of each job, with its `trained_tokens` (one query for all)."""
    tokens = trained_tokens(session, found)
    return [job_object(j, tokens.get(j.id)) for j in found]


def job_object(job: Job, trained_tokens: int | None = None) -> dict[str, Any]:
    """A Torchyard job as an OpenAI `fine_tuning.job` object; `trained_tokens` from
    `openai_results.trained_tokens` (None until it succeeds, as OpenAI reports it)."""
    spec = job.spec
    assert isinstance(spec, JobSpec)
    labels = job.labels or {}
    method = method_object(job)
    hyper = method[method["type"]]["hyperparameters"]
    error = None
    if job.state == JobState.FAILED:
        cls = (job.failure or {}).get("class") or "failed"
        error = {"code": str(cls), "message": job.error or "the job failed", "param": None}
    return {
        "id": f"{JOB_PREFIX}{job.id}",
        "object": "fine_tuning.job",
        "created_at": ts(job.created_at),
        "finished_at": ts(job.finished_at),
        "model": labels.get(MODEL_LABEL, labels[BASE_LABEL]),
        "fine_tuned_model": model_name(job) if job.state == JobState.SUCCEEDED else None,
        "organization_id": job.project_id,
        "status": STATUS.get(JobState(job.state), "running"),
        "training_file": spec.data.dataset,
        "validation_file": spec.data.eval_dataset,
        "result_files": [result_file_id(job)] if job.state == JobState.SUCCEEDED else [],
        "trained_tokens": trained_tokens if job.state == JobState.SUCCEEDED else None,
        "estimated_finish": _estimated_finish(job),
        "error": error,
        "seed": spec.seed,
        "hyperparameters": {k: v for k, v in hyper.items() if k in COMMON_HYPERPARAMETERS},
        "method": method,
        "metadata": {
            k.removeprefix(META_PREFIX): v for k, v in labels.items() if k.startswith(META_PREFIX)
        }
        or None,
        "integrations": None,
        "user_provided_suffix": labels.get(SUFFIX_LABEL) or None,
    }


def event_object(event: JobEvent) -> dict[str, Any]:
    """A job event as an OpenAI `fine_tuning.job.event`."""
    level = "error" if event.state_to == JobState.FAILED or event.kind == "error" else "info"
    message = event.message or event.kind
    if event.state_to:
        message = f"{event.state_to}: {message}" if event.message else str(event.state_to)
    return {
        "id": f"{EVENT_PREFIX}{event.id}",
        "object": "fine_tuning.job.event",
        "created_at": ts(event.created_at),
        "level": level,
        "message": message,
        "data": {"kind": event.kind, **(event.data or {})},
        "type": "message",
    }


def events_page(
    session: Session, job: Job, after: str | None, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """Newest first; `after` is the id of the last event of the previous page."""
    query = select(JobEvent).where(JobEvent.job_id == job.id)
    if after is not None:
        query = query.where(JobEvent.id < _suffix_int(after, EVENT_PREFIX, "after"))
    rows = list(session.scalars(query.order_by(JobEvent.id.desc()).limit(limit + 1)))
    return [event_object(e) for e in rows[:limit]], len(rows) > limit


def jobs_page(
    session: Session,
    project_id: str,
    after: str | None,
    limit: int,
    metadata: dict[str, str] | None = None,
) -> tuple[list[Job], bool]:
    """The project's fine-tuning jobs (labelled `openai.base`; with every `metadata` key=value
    among their `openai.meta.` labels), newest first, after the job `after` (`ftjob-<id>`):
    one keyset query on (project_id, id). Raises InvalidInput for a malformed `after`."""
    query = select(Job).where(Job.project_id == project_id, _has_label(session, BASE_LABEL))
    for key, value in (metadata or {}).items():
        query = query.where(_has_label(session, f"{META_PREFIX}{key}", value))
    if after is not None:
        query = query.where(Job.id < _suffix_int(after, JOB_PREFIX, "after"))
    rows = list(session.scalars(query.order_by(Job.id.desc()).limit(limit + 1)))
    # A script job labelled `openai.base` by hand is not a fine-tune: left out of the page.
    return [j for j in rows[:limit] if is_fine_tune(j)], len(rows) > limit


def _has_label(session: Session, key: str, value: str | None = None) -> ColumnElement[bool]:
    """`key in labels` (and `labels[key] == value` when given): JSONB operators on Postgres,
    a `json_each` probe on SQLite."""
    if session.get_bind().dialect.name == "postgresql":
        labels = type_coerce(Job.labels, JSONB)
        return labels.has_key(key) if value is None else labels.contains({key: value})
    each = func.json_each(Job.labels).table_valued("key", "value")
    probe = select(1).select_from(each).where(each.c.key == key)
    if value is not None:
        probe = probe.where(each.c.value == value)
    return probe.exists()


def _suffix_int(raw: str, prefix: str, param: str) -> int:
    digits = raw.removeprefix(prefix)
    if not raw.startswith(prefix) or not digits.isdigit() or len(digits) > 18:
        raise InvalidInput(
            f"{param}: not an id this API returned ({prefix}...)",
            details=[{"loc": ["query", param], "msg": "malformed id", "type": "value_error"}],
        )
    return int(digits)


def checkpoint_objects(session: Session, job: Job) -> list[dict[str, Any]]:
    """The job's complete checkpoints, newest first, with the metrics at their step."""
    rows = list(
        session.scalars(
            select(Checkpoint).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step.desc())
        )
    )
    return [_checkpoint(session, job, c) for c in rows]


def _checkpoint(session: Session, job: Job, ckpt: Checkpoint) -> dict[str, Any]:
    points = session.execute(
        select(MetricPoint.name, MetricPoint.value).where(
            MetricPoint.job_id == job.id, MetricPoint.step == ckpt.step
        )
    )
    values = {name: value for name, value in points if math.isfinite(value)}
    metrics: dict[str, Any] = {"step": float(ckpt.step)}
    for ours, theirs in (("loss", "train_loss"), ("eval_loss", "valid_loss")):
        if ours in values:
            metrics[theirs] = values[ours]
    # the final checkpoint's loss on the whole validation file, once its eval job scored it
    # (`core.openai.spec.FULL_VALID`); before that, the trainer's eval loss at the step
    full = session.execute(
        select(Evaluation.metrics).where(
            Evaluation.source_job_id == job.id,
            Evaluation.checkpoint_id == ckpt.id,
            Evaluation.name == FULL_VALID,
        )
    ).scalar_one_or_none()
    metrics["full_valid_loss"] = (full or {}).get("loss", values.get("eval_loss"))
    return {
        "id": f"{CHECKPOINT_PREFIX}{ckpt.id}",
        "object": "fine_tuning.job.checkpoint",
        "created_at": ts(ckpt.created_at),
        "fine_tuned_model_checkpoint": f"{model_name(job)}:ckpt-step-{ckpt.step}",
        "fine_tuning_job_id": f"{JOB_PREFIX}{job.id}",
        "metrics": metrics,
        "step_number": ckpt.step,
    }


def model_objects(session: Session, settings: Settings, project_id: str) -> list[dict[str, Any]]:
    """The base models, then the project's succeeded fine-tunes (oldest first)."""
    out = [base_model_object(name) for name in settings.base_models]
    query = (
        select(Job)
        .where(Job.project_id == project_id, Job.state == JobState.SUCCEEDED)
        .order_by(Job.id)
    )
    out.extend(fine_tune_object(j) for j in session.scalars(query) if is_fine_tune(j))
    return out


def base_model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "torchyard"}


def fine_tune_object(job: Job) -> dict[str, Any]:
    created = ts(job.finished_at) or ts(job.created_at)
    return {
        "id": model_name(job),
        "object": "model",
        "created": created,
        "owned_by": job.project_id,
    }


def fine_tuned(session: Session, project_id: str, model_id: str) -> Job | None:
    """The succeeded fine-tuning job of project `project_id` whose model is `model_id`
    (`ft:<base>:<project>:<suffix>:<job id>`, exactly as `model_name` writes it); None for any
    other id, another project's model or a job that has not succeeded."""
    last = model_id.rsplit(":", 1)[-1]
    if not (model_id.startswith("ft:") and last.isdigit() and len(last) <= 18):
        return None
    job = jobs.get(session=session, job_id=int(last), project_id=project_id)
    if job is None or not is_fine_tune(job) or job.state != JobState.SUCCEEDED:
        return None
    return job if model_name(job) == model_id else None


def find_model(
    session: Session, settings: Settings, project_id: str, model_id: str
) -> dict[str, Any]:
    """One model by id. Raises NotFound (404)."""
    if model_id in settings.base_models:
        return base_model_object(model_id)
    if (job := fine_tuned(session, project_id, model_id)) is not None:
        return fine_tune_object(job)
    raise NotFound(f"model {model_id[:200]!r} not found")
