"""A job's restart budget as people read it: per failure class allowed / used / left, the cap,
and one sentence saying what the policy did.

Pure (no I/O). The budgets are `core.attempts.lifecycle_policy.Policy`'s (the one place the policy
is written); this module only counts them against the job's `restarts_used` / `restarts_by_class`
columns. The API serves the result as `Job.retry_policy`; the CLI and the dashboard print its
`summary`.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

from core.attempts.lifecycle_policy import Policy
from core.platform.tables import JobState
from jobspec.job import FailureClass, RetrySpec

__all__ = ["BUDGETED", "ClassBudget", "RetryPolicy", "retry_policy"]

# `preempted` attempts are requeued without using any budget: it has none to show.
BUDGETED: tuple[FailureClass, ...] = tuple(
    c for c in FailureClass if c is not FailureClass.PREEMPTED
)


class ClassBudget(BaseModel):
    """Restarts after failures of one class."""

    allowed: int = Field(
        description="Restarts allowed (`retries.on.<class>`, else `retries.max_restarts`; "
        "`user_error` 0 and `oom` 0 unless `retries.retry_oom`)."
    )
    used: int = Field(description="Restarts used since submission or the last manual retry.")
    left: int = Field(description="Restarts left: this class's and the cap's, whichever is less.")


class RetryPolicy(BaseModel):
    """What the job's `retries` allow and what has been used of it."""

    cap: int = Field(
        description="Restarts of all classes together (`retries.max_total_restarts`, else the "
        "largest per-class budget)."
    )
    used: int = Field(description="Restarts of all classes used (the job's `restarts_used`).")
    left: int = Field(description="Restarts left under the cap.")
    by_class: dict[FailureClass, ClassBudget] = Field(
        description="Per failure class (all but `preempted`, which is requeued without using "
        "any budget)."
    )
    summary: str = Field(
        description="In words: restarts used per class against their budget, and for a failed "
        "job why it was not restarted, e.g. `restarted 2 times (infra 2/3, hang 0/2); no "
        "restarts left for oom`."
    )


def retry_policy(
    *,
    retries: RetrySpec,
    restarts_used: int,
    restarts_by_class: Mapping[str, int],
    state: str,
    failure_class: FailureClass | None,
) -> RetryPolicy:
    """The budget of a job whose spec has `retries`, with its counters; `state` and
    `failure_class` (the latest failure's, None when none) decide the summary's last clause."""
    policy = Policy.from_spec(retries)
    cap_left = max(0, policy.cap - restarts_used)
    by_class: dict[FailureClass, ClassBudget] = {}
    for cls in BUDGETED:
        allowed, used = policy.budget(cls), restarts_by_class.get(str(cls), 0)
        by_class[cls] = ClassBudget(
            allowed=allowed, used=used, left=min(max(0, allowed - used), cap_left)
        )
    return RetryPolicy(
        cap=policy.cap,
        used=restarts_used,
        left=cap_left,
        by_class=by_class,
        summary=_summary(by_class, restarts_used, policy.cap, state, failure_class),
    )


def _summary(
    by_class: Mapping[FailureClass, ClassBudget],
    used: int,
    cap: int,
    state: str,
    failure_class: FailureClass | None,
) -> str:
    counts = [f"{c} {b.used}/{b.allowed}" for c, b in by_class.items() if b.allowed or b.used]
    if not counts:
        return "no restarts allowed (the spec's `retries`)"
    times = "not restarted" if used == 0 else f"restarted {_times(used)}"
    bound = f", at most {cap} in all" if cap < sum(b.allowed for b in by_class.values()) else ""
    head = f"{times} ({', '.join(counts)}{bound})"
    if state != JobState.FAILED or failure_class is None or failure_class not in by_class:
        return head
    budget = by_class[failure_class]
    if budget.allowed == 0:
        return f"{head}; {failure_class} is not restarted (budget 0)"
    if budget.used >= budget.allowed:
        return f"{head}; no restarts left for {failure_class}"
    return f"{head}; restart cap reached ({used} of {cap})"


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"
