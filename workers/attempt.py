"""The steps of a node's attempt around its torchrun (`workers.node`): preparing the run dir,
recording the launch, failing an attempt that cannot launch, retried DB writes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from core.attempts import gang, lifecycle_apply
from core.attempts.lifecycle_apply import facts_for
from core.attempts.lifecycle_policy import Failure, FailureClass, Outcome, decide
from core.datasets import service as datasets
from core.jobs import evaluations, init_from
from core.jobs import service as jobs
from core.jobs.service import ACTIVE_STATES
from core.platform.errors import InvalidInput
from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri, job_run_dir, row_cache_dir
from core.platform.tables import Job, JobState
from core.scheduling import preemption_apply as preempt
from core.usage import report as usage_report
from core.usage.accounting import as_utc
from jobspec.job import EvalJobSpec, JobSpec, SessionJobSpec
from workers.checkpoints import set_aside_unrecorded
from workers.launcher import RunPaths

log = logging.getLogger(__name__)

Dispatch = Callable[[int, str], None]  # (job_id, queue) -> send workers.run_job
T = TypeVar("T")
DB_RETRIES = 8


class MaxRuntime(Exception):
    """`limits.max_runtime_s` is used up."""

    def __init__(self, runtime_s: float) -> None:
        super().__init__(f"max_runtime_s exceeded ({int(runtime_s)} s)")


class BudgetSpent(Exception):
    """`limits.max_cost` is used up (earlier attempts' cost reached it)."""

    def __init__(self, cost: float, max_cost: float) -> None:
        super().__init__(f"budget: limits.max_cost reached (cost {cost:.6g} of {max_cost:g})")


class Unlaunched(Exception):
    """An attempt that cannot launch, with its own failure class and the log lines that say
    why (a failed `requirements` install: `workers.entrypoint.script`). `retryable`: the attempt's
    end goes through the retry policy like a failed run's (storage unreachable while preparing),
    instead of failing the job."""

    def __init__(
        self,
        message: str,
        failure_class: FailureClass,
        *,
        log_tail: tuple[str, ...] = (),
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.failure_class = failure_class
        self.log_tail = log_tail
        self.retryable = retryable


def runtime_budget(job: Job) -> float | None:
    """Seconds this attempt may run under `limits.max_runtime_s`; None without a limit."""
    limit = job.spec.limits.max_runtime_s
    return None if limit is None else limit - float(job.runtime_s or 0.0)


def budget_spent(
    settings: Settings, factory: Callable[[], Session], job: Job
) -> BudgetSpent | None:
    """`BudgetSpent` when the earlier attempts' cost reached `limits.max_cost`.

    Counted up to this attempt's claim (`job.started_at`), so the time between the claim and
    this check (data preparation on a busy host) is not spent before the trainer starts: the
    running attempt's cost is the supervisor's to watch (`workers.watchers.usage_watch`)."""
    limit = job.spec.limits.max_cost
    if limit is None:
        return None
    claimed = as_utc(job.started_at) if job.started_at is not None else None
    spent = with_db_retry(
        factory,
        lambda s: usage_report.job_cost(
            session=s, job_id=job.id, prices=settings.slot_prices, now=claimed
        ),
    )
    return BudgetSpent(spent, limit) if spent >= limit else None


def prepare(
    settings: Settings,
    factory: Callable[[], Session],
    job: Job,
    spec: JobSpec,
    node_rank: int | None = None,
) -> RunPaths:
    """Resolve the data, create the run dir and write the spec the trainer reads (an
    entrypoint job's attempt is prepared by `workers.entrypoint.script.prepare`).

    `node_rank`: the node of a multi-node attempt (its own run dir; only node 0 sets aside the
    checkpoints no earlier attempt recorded)."""
    if spec.data.dataset is not None:
        data = _dataset_uri(factory, job, "dataset", spec.data.dataset)
    else:
        assert spec.data.uri is not None  # the spec allows exactly one
        data = spec.data.uri
    eval_data = None
    if spec.data.eval_dataset is not None:
        eval_data = _dataset_uri(factory, job, "eval_dataset", spec.data.eval_dataset)
    checkpoint_dir = job_checkpoint_uri(settings, job.id)
    if settings.is_local_storage:
        Path(checkpoint_dir.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    if job.attempt > 1 and not node_rank:
        with_db_retry(
            factory,
            lambda s: set_aside_unrecorded(
                session=s, job_id=job.id, attempt=job.attempt, root=checkpoint_dir
            ),
        )
    source = spec.model.init_from
    init_uri = None
    if source is not None:
        init_uri = with_db_retry(
            factory,
            lambda s: init_from.launch_uri(
                session=s, job_id=job.id, project_id=job.project_id, source=source
            ),
        )
    paths = RunPaths(
        run_dir=job_run_dir(settings, job.id, job.attempt, node_rank),
        checkpoint_dir=checkpoint_dir,
        data=data,
        init_from=init_uri,
        eval_data=eval_data,
        cache_dir=row_cache_dir(settings, job.project_id),
    )
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    assert paths.cache_dir is not None
    paths.cache_dir.mkdir(parents=True, exist_ok=True)  # the sandbox binds only what exists
    paths.spec.write_text(job.spec.model_dump_json(indent=2))
    return paths


def prepare_session(settings: Settings, job: Job, spec: SessionJobSpec) -> RunPaths:
    """A session job's run dir and its spec; its base model (a local directory: shown
    read-only in the sandbox) as `source_model`."""
    paths = RunPaths(
        run_dir=job_run_dir(settings, job.id, job.attempt, None),
        checkpoint_dir=job_checkpoint_uri(settings, job.id),
        source_model=spec.model.hf.path_or_id if spec.model.hf is not None else None,
    )
    if settings.is_local_storage:
        Path(paths.checkpoint_dir.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    paths.spec.write_text(spec.model_dump_json(indent=2))
    return paths


def prepare_eval(
    settings: Settings, factory: Callable[[], Session], job: Job, spec: EvalJobSpec
) -> RunPaths:
    """An eval job's run dir: its spec, and `inputs.json` with every location its program
    reads (`core.jobs.evaluations.launch_inputs`). Raises `InvalidInput` when the checkpoint
    or a dataset has gone since submission."""
    located = with_db_retry(
        factory,
        lambda s: evaluations.launch_inputs(session=s, settings=settings, job=job, spec=spec),
    )
    extra = [
        located["source_init_from"],
        *(d["uri"] for d in located["datasets"].values()),
        *(d["uri"] for d in located["task_datasets"].values()),
        *located["lm_eval_task_dirs"],
    ]
    paths = RunPaths(
        run_dir=job_run_dir(settings, job.id, job.attempt, None),
        checkpoint_dir=job_checkpoint_uri(settings, job.id),
        data=located["source_data"],
        init_from=(located["checkpoint"] or {}).get("uri"),  # None: the starting weights
        eval_data=located["source_eval_data"],
        cache_dir=row_cache_dir(settings, job.project_id),
        extra_inputs=tuple(uri for uri in extra if uri),
        source_model=located["source_model"],
    )
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    assert paths.cache_dir is not None
    paths.cache_dir.mkdir(parents=True, exist_ok=True)  # the sandbox binds only what exists
    paths.spec.write_text(spec.model_dump_json(indent=2))
    paths.inputs.write_text(json.dumps(located, indent=2))
    return paths


def _dataset_uri(factory: Callable[[], Session], job: Job, field: str, dataset_id: str) -> str:
    """Where the project's dataset `dataset_id` (named by `data.<field>`) lies; InvalidInput
    when it has gone since submission."""
    dataset = with_db_retry(
        factory,
        lambda s: datasets.get(session=s, dataset_id=dataset_id, project_id=job.project_id),
    )
    if dataset is None:
        raise InvalidInput(f"data.{field}: dataset {dataset_id!r} not found")
    return dataset.uri


def record_launch(
    factory: Callable[[], Session],
    job: Job,
    pgid: int,
    argv: list[str],
    worker: str,
    node_rank: int | None = None,
    devices: Sequence[int] = (),
) -> None:
    """The `launched torchrun` event, and the node's leased `devices` on its `job_nodes` row."""
    node = "" if node_rank is None else f" as node {node_rank}"
    data: dict[str, Any] = {"pgid": pgid, "worker": worker, "argv": argv, "devices": list(devices)}
    if node_rank is not None:
        data["node_rank"] = node_rank
    on = f" on devices {','.join(map(str, devices))}" if devices else ""
    try:
        with factory() as session:
            gang.record_devices(session=session, job=job, node_rank=node_rank or 0, devices=devices)
            jobs.add_event(
                session=session,
                job=job,
                kind="info",
                message=f"launched torchrun (pgid {pgid}) on {worker}{node}{on}",
                data=data,
            )
            session.commit()
    except Exception:  # the run matters more than this row
        log.exception("job %s: could not record the launch", job.id)


def record_hints(factory: Callable[[], Session], job: Job, hints: Sequence[str]) -> None:
    """A `warning` event per hint the launch found (`workers.program.unseen_paths`)."""
    try:
        with factory() as session:
            for hint in hints:
                jobs.add_event(
                    session=session, job=job, kind="warning", message=hint, data={"hint": hint}
                )
            session.commit()
    except Exception:  # the run matters more than these rows
        log.exception("job %s: could not record the launch's hints", job.id)


def fail_unlaunched(session: Session, job: Job, exc: Exception) -> str:
    """End an attempt whose trainer never started: cancelled, paused or requeued (preempted)
    when that was asked for, else failed with `exc` as a `user_error` (an unknown dataset, an
    invalid spec) or `infra` (an OSError preparing the run dir), or with `Unlaunched`'s own
    class, reason and log tail; `MaxRuntime` and `BudgetSpent` are limits, not failure classes.
    Not retried, except a `retryable` `Unlaunched`: its end goes through the retry policy
    (`Outcome.RESTART` when the job went back to the queue: the caller dispatches it). Commits;
    returns the outcome."""
    current = session.get(Job, job.id, populate_existing=True)
    if current is None or current.attempt != job.attempt or current.state not in ACTIVE_STATES:
        return "lost"
    if current.state == JobState.CANCELLING:
        jobs.end_stop(session=session, job_id=job.id)
        session.commit()
        return Outcome.CANCELLED
    if current.state == JobState.PAUSING:
        jobs.transition(session=session, job_id=job.id, to=JobState.PAUSED, message="paused")
        session.commit()
        return Outcome.PAUSED
    if current.state == JobState.PREEMPTING:  # the pool's next wake or re-send claims it
        preempt.requeue(session=session, job=current, attempt=job.attempt)
        session.commit()
        return Outcome.PREEMPTED
    error = str(getattr(exc, "message", None) or exc)
    data: dict[str, Any] = {"attempt": job.attempt}
    values: dict[str, Any] = {"error": error}
    failure: Failure | None = None
    if isinstance(exc, MaxRuntime):  # a limit, not a failure of the code
        data["limit"] = "max_runtime_s"
    elif isinstance(exc, BudgetSpent):
        data |= {"limit": "max_cost", "reason": "budget"}
    elif isinstance(exc, Unlaunched):
        failure = Failure(exc.failure_class, error, log_tail=exc.log_tail)
        if exc.retryable:
            decision = decide(facts_for(current, lost=failure))
            pool = lifecycle_apply.apply(session=session, job=current, decision=decision)
            session.commit()
            return str(Outcome.RESTART if pool is not None else decision.outcome)
    else:
        cls = FailureClass.INFRA if isinstance(exc, OSError) else FailureClass.USER_ERROR
        failure = Failure(cls, f"cannot launch: {error}")
    if failure is not None:
        data |= {"failure_class": str(failure.failure_class), "reason": failure.reason}
        values["failure"] = failure.to_json()
    jobs.transition(
        session=session,
        job_id=job.id,
        to=JobState.FAILED,
        message=f"cannot launch: {error}",
        data=data,
        values=values,
    )
    session.commit()
    return Outcome.FAILED


def dispatch_safely(dispatch: Dispatch, job_id: int, queue: str) -> None:
    try:
        dispatch(job_id, queue)
    except Exception:  # the job is queued in the DB: the reconciler sends it again
        log.exception("job %s: dispatch to %r failed; the reconciler will retry", job_id, queue)


def with_db_retry(
    factory: Callable[[], Session], write: Callable[[Session], T], *, retries: int = DB_RETRIES
) -> T:
    """Run `write` in a fresh session, retrying DB errors with backoff (~1 min by default)."""
    delay = 0.5
    for attempt in range(1, retries + 1):
        try:
            with factory() as session:
                return write(session)
        except SQLAlchemyError:
            if attempt == retries:
                raise
            log.exception("database write failed (try %d); retrying in %.1f s", attempt, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
    raise AssertionError("unreachable")
