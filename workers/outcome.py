"""How an attempt ends: the verdict from what happened, and the requeue of a job.

Shared by the runner (the trainer exited) and the reaper (the worker vanished).
"""

from __future__ import annotations

import enum
import re
import signal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core import jobs
from core.models import Job, JobEvent, JobState

EXIT_INVALID = 2  # the trainer's "invalid spec or data": retrying cannot help (CONTRACTS.md)
EXIT_SIGKILL = (-signal.SIGKILL, 128 + signal.SIGKILL)  # how torchrun / a shell report SIGKILL

_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|DefaultCPUAllocator: can't allocate")
_COLLECTIVE = re.compile(
    r"collective operation timeout|(NCCL|[Gg]loo|c10d).{0,200}(timed? ?out|Timeout)"
    r"|DistNetworkError|Connection reset by peer|Connection closed by peer",
    re.IGNORECASE,
)


class ExitCause(enum.StrEnum):
    """Why an attempt failed, as far as its exit code and last output tell.

    The retry policy (`retryable`): spec/data errors never; out-of-memory only with
    `retries.retry_oom` (it usually fails again the same way); the rest while
    `retries.max_restarts` lasts. `max_runtime` is a limit, not a failure to retry.
    """

    SPEC_ERROR = "spec_error"  # exit 2
    OOM = "oom"  # CUDA/CPU OOM in the output, or a rank SIGKILLed (the kernel's OOM killer)
    COLLECTIVE_TIMEOUT = "collective_timeout"  # NCCL/gloo timeouts, a peer gone
    SIGNAL = "signal"  # a rank killed by another signal
    WORKER_LOST = "worker_lost"  # the worker (node) stopped heartbeating
    MAX_RUNTIME = "max_runtime"  # `limits.max_runtime_s` reached
    ERROR = "error"  # any other failure (a Python exception, ...)


def classify(returncode: int, output: str) -> ExitCause:
    """The cause of a failed attempt from the trainer's exit code and its last stderr/errors."""
    if returncode == EXIT_INVALID:
        return ExitCause.SPEC_ERROR
    if _OOM.search(output) or returncode in EXIT_SIGKILL:
        return ExitCause.OOM
    if _COLLECTIVE.search(output):
        return ExitCause.COLLECTIVE_TIMEOUT
    if returncode < 0 or returncode > 128:
        return ExitCause.SIGNAL
    return ExitCause.ERROR


def retryable(cause: ExitCause, *, retry_oom: bool) -> bool:
    if cause in (ExitCause.SPEC_ERROR, ExitCause.MAX_RUNTIME):
        return False
    return retry_oom if cause is ExitCause.OOM else True


class Cause(enum.StrEnum):
    """Why a job went back to the queue; only failures use up `retries.max_restarts`."""

    FAILURE = "failure"
    SHUTDOWN = "shutdown"


class Verdict(enum.StrEnum):
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    PAUSED = "paused"
    HAND_BACK = "hand_back"
    RESTART = "restart"
    FAILED = "failed"


def verdict(
    *,
    returncode: int,
    completed: bool,
    state: str,
    shutdown: bool,
    restarts_left: int,
    cause: ExitCause | None = None,
    retry_oom: bool = False,
) -> Verdict:
    """The end of an attempt whose trainer exited with `returncode`.

    `completed`: the trainer reported `status completed`; `state`: the job's state now;
    `shutdown`: the worker stopped the trainer because the worker itself is stopping;
    `cause`: the failure's cause (default: from the exit code alone).
    """
    if returncode == 0 and completed:
        return Verdict.SUCCEEDED
    if state == JobState.CANCELLING:
        return Verdict.CANCELLED
    if state == JobState.PAUSING:
        return Verdict.PAUSED
    if shutdown:
        return Verdict.HAND_BACK
    cause = cause or classify(returncode, "")
    if restarts_left > 0 and retryable(cause, retry_oom=retry_oom):
        return Verdict.RESTART
    return Verdict.FAILED


def restarts_left(session: Session, job: Job) -> int:
    """`retries.max_restarts` minus the failure restarts since the job's last manual retry."""
    allowed = job.spec.retries.max_restarts
    rows = session.execute(
        select(JobEvent.state_to, JobEvent.data)
        .where(
            JobEvent.job_id == job.id,
            JobEvent.kind == "state",
            JobEvent.state_to.in_([JobState.RESTARTING, JobState.QUEUED]),
        )
        .order_by(JobEvent.id)
    ).all()
    used = 0
    for state_to, data in rows:
        cause = (data or {}).get("cause")
        if state_to == JobState.QUEUED and cause == "retry":
            used = 0  # `POST /v1/jobs/{id}/retry` gives a fresh budget
        elif state_to == JobState.RESTARTING and cause == Cause.FAILURE:
            used += 1
    return allowed - used


def requeue(
    *,
    session: Session,
    job_id: int,
    cause: Cause,
    message: str,
    data: dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
) -> Job:
    """starting | running -> restarting -> queued, recording why. Does not commit or dispatch."""
    jobs.transition(
        session=session,
        job_id=job_id,
        to=JobState.RESTARTING,
        message=message,
        data={"cause": str(cause), **(data or {})},
        values=values,
    )
    return jobs.transition(
        session=session, job_id=job_id, to=JobState.QUEUED, message=f"requeued ({cause})"
    )
