"""Apply a `core.attempts.lifecycle_policy.Decision` to a job: the one place an attempt's end
changes the row.

The workers (a node whose torchrun exited) and the reconciler (a node gone silent) gather the
facts, call `core.attempts.lifecycle_policy.decide`, then `apply` in the same transaction that
recorded the facts. Every state change goes through `core.jobs.service.transition` (guarded UPDATE +
event row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from core.attempts.lifecycle_policy import AttemptFacts, Decision, Failure, NodeEnd, Outcome, Policy
from core.jobs import service as jobs
from core.platform.tables import Job, JobState
from core.scheduling import preemption_apply as preempt
from core.submission import eval_after
from jobspec.job import spec_kind

LOG_TAIL_LINES = 20


def facts_for(
    job: Job, *, ended: Sequence[NodeEnd] = (), lost: Failure | None = None
) -> AttemptFacts:
    """`AttemptFacts` of the job's current attempt from its row (state, counters, policy) and
    the node ends (or the lost node) gathered by the caller."""
    return AttemptFacts(
        attempt=job.attempt,
        state=JobState(job.state),
        num_nodes=job.spec.resources.nodes,
        ended=tuple(ended),
        policy=Policy.from_spec(job.spec.retries),
        restarts_used=job.restarts_used,
        restarts_by_class=dict(job.restarts_by_class or {}),
        lost=lost,
        kind=spec_kind(job.spec),
    )


def error_text(failure: Failure) -> str:
    """The job's `error` column: `[class] reason`, then the failing rank's last log lines."""
    lines = [f"[{failure.failure_class}] {failure.reason}"]
    if failure.log_tail:
        where = "" if failure.rank is None else f" of rank {failure.rank}"
        lines.append(f"--- last log lines{where} ---")
        lines += failure.log_tail[-LOG_TAIL_LINES:]
    return "\n".join(lines)


def apply(
    *,
    session: Session,
    job: Job,
    decision: Decision,
    runtime_s: float = 0.0,
    exit_code: int | None = None,
    completed: dict[str, Any] | None = None,
) -> str | None:
    """Move `job` (the current row, as read in this transaction) to where `decision` leads.

    `runtime_s`: seconds this attempt trained (added to `runtime_s`); `exit_code`: the failing
    rank's code (0 on success); `completed`: the trainer's `completed` report. Returns the pool
    to dispatch to when the job went back to the queue, else None. Does not commit. Raises
    `core.platform.errors.Conflict` when the job's state moved under the caller (the transition
    guard).
    """
    outcome, failure = decision.outcome, decision.failure
    if outcome is Outcome.WAIT:
        return None
    values: dict[str, Any] = {"runtime_s": Job.runtime_s + runtime_s, "exit_code": exit_code}
    data: dict[str, Any] = {"attempt": job.attempt, "exit_code": exit_code}
    if failure is not None:
        values |= {"failure": failure.to_json(), "error": error_text(failure)}
        data |= {"failure_class": str(failure.failure_class), "reason": failure.reason}
    if outcome is Outcome.SUCCEEDED:
        if job.state == JobState.STARTING:
            jobs.transition(session=session, job_id=job.id, to=JobState.RUNNING)
        jobs.transition(
            session=session,
            job_id=job.id,
            to=JobState.SUCCEEDED,
            message=decision.message,
            data=completed,
            # `failure` stays: the last failed attempt of a job that recovered from it.
            values={**values, "error": None},
        )
        eval_after.after_success(session=session, job=job)  # its `eval_after`, if any
    elif outcome is Outcome.CANCELLED:  # or `pruned`, when its sweep's pruner stopped it
        jobs.end_stop(session=session, job_id=job.id, message=decision.message, values=values)
    elif outcome is Outcome.PAUSED:
        jobs.transition(
            session=session,
            job_id=job.id,
            to=JobState.PAUSED,
            message=decision.message,
            values=values,
        )
    elif outcome is Outcome.PREEMPTED:
        preempt.requeue(session=session, job=job, attempt=job.attempt, values=values)
        return job.pool
    elif outcome is Outcome.FAILED:
        message = decision.message
        if failure is None:  # a limit (max_runtime_s, max_cost), not a failure of the code
            data["limit"] = decision.limit or "max_runtime_s"
            if data["limit"] == "max_runtime_s":
                message = f"{message} ({int(float(job.runtime_s or 0.0) + runtime_s)} s)"
            else:
                data["reason"] = "budget"
            values["error"] = message
        jobs.transition(
            session=session,
            job_id=job.id,
            to=JobState.FAILED,
            message=message,
            data=data,
            values=values,
        )
    else:
        cause = "failure" if outcome is Outcome.RESTART else "shutdown"
        if outcome is Outcome.RESTART and failure is not None:
            key = str(failure.failure_class)
            by_class = dict(job.restarts_by_class or {})
            by_class[key] = by_class.get(key, 0) + 1
            values |= {"restarts_used": Job.restarts_used + 1, "restarts_by_class": by_class}
        elif failure is not None:  # preempted: requeued without using the budget
            cause = str(failure.failure_class)
        requeue(
            session=session,
            job_id=job.id,
            cause=cause,
            message=decision.message,
            data=data,
            values=values,
        )
        return job.pool
    return None


def requeue(
    *,
    session: Session,
    job_id: int,
    cause: str,
    message: str,
    data: dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
) -> Job:
    """starting | running -> restarting -> queued, recording why (`cause`: failure, shutdown,
    preempted). Does not commit or dispatch."""
    jobs.transition(
        session=session,
        job_id=job_id,
        to=JobState.RESTARTING,
        message=message,
        data={"cause": cause, **(data or {})},
        values=values,
    )
    return jobs.transition(
        session=session, job_id=job_id, to=JobState.QUEUED, message=f"requeued ({cause})"
    )
