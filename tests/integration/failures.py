"""Failed jobs for the tests of what the API, CLI and dashboard show about a failure.

The row is written as `core.attempts.lifecycle_apply.apply` writes it when the lifecycle fails or
restarts a job (`failure`, `error`, `exit_code`, the restart counters), on a job made by
`core.jobs.service.create`: the tests of the views need the row, not a training run that ends that
way (the workers' tests inject those faults).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Engine, update

from core.attempts.lifecycle_apply import error_text
from core.attempts.lifecycle_policy import Failure
from core.platform.db import session_scope
from core.platform.tables import Job, JobState, utcnow
from dataformat.failures import FailureClass

# Budgets: hang 2, infra 3, the rest 0 (max_restarts 0); cap 3 (the largest).
RETRIES = {"on": {"infra": 3, "hang": 2}}

OOM = Failure(
    failure_class=FailureClass.OOM,
    reason="CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.1 GiB total)",
    rank=3,
    node_rank=1,
    host="host-b",
    exit_code=1,
    log_tail=(
        "step 120 | loss 2.9114 | 51234 tok/s",
        '  File "train.py", line 88, in forward',
        "    logits = self.lm_head(x)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ),
)

INFRA = Failure(
    failure_class=FailureClass.INFRA,
    reason="collective timed out: ALLREDUCE after 600 s (NCCL watchdog)",
    rank=1,
    node_rank=0,
    host="host-a",
    exit_code=1,
    log_tail=("[rank1] Watchdog caught collective operation timeout",),
)

USER_ERROR = Failure(
    failure_class=FailureClass.USER_ERROR,
    reason="KeyError: 'labels' (the spec's `data.format` reads no `labels` column)",
    rank=1,
    node_rank=0,
    host="host-a",
    exit_code=1,
    log_tail=("[rank1]: KeyError: 'labels'",),
)


def fail_job(
    engine: Engine,
    job_id: int,
    failure: Failure,
    *,
    state: JobState = JobState.FAILED,
    restarts_by_class: Mapping[str, int] | None = None,
) -> None:
    """Give job `job_id` `failure` as its latest failure, in `state` (`failed`, or `running`
    for a job restarted after it), with `restarts_by_class` restarts used."""
    by_class = dict(restarts_by_class or {})
    values = {
        "state": str(state),
        "failure": failure.to_json(),
        "error": error_text(failure),
        "exit_code": failure.exit_code,
        "restarts_used": sum(by_class.values()),
        "restarts_by_class": by_class,
        "attempt": sum(by_class.values()) + 1,
        "started_at": utcnow(),
        "finished_at": utcnow() if state == JobState.FAILED else None,
    }
    with session_scope(engine) as session:
        session.execute(update(Job).where(Job.id == job_id).values(**values))
