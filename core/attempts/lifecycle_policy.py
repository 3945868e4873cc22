"""What the end of an attempt means: typed facts in, the job's next state out.

One pure function, `decide`, holds the policy that was spread over the runner, the gang node
and the reaper: the workers (each node, when its torchrun exits) and the reconciler (when a
node went silent) only gather `AttemptFacts` and apply the `Decision`
(`core.attempts.lifecycle_apply.apply`). No I/O here; `tests/unit/core/test_lifecycle.py` is the
table of cases.

An attempt is a gang of N >= 1 nodes. A node that *failed* (its trainer exited non-zero
without the worker asking, or its worker ended it for a hang) ends the whole attempt at once:
the other nodes find the attempt no longer theirs and kill their trainers. Any other end
(success, a stop for cancel / pause / preempt / shutdown / max_runtime / budget) waits until every
node ended. A job stopped for preemption (`preempting`) goes back to the queue without using
any restart, whether its ranks exited cleanly or died of the stop.

Restarts (after Determined's and Kubeflow's per-cause restart policies): a failure of class C
restarts from the latest checkpoint while C's budget (`retries.on[C]`, else `max_restarts`;
`user_error` 0, `oom` 0 unless `retry_oom`) and the global cap (`max_total_restarts`) last.
`restarts_used` and `restarts_by_class` are columns of the job, reset by a manual retry.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.platform.tables import JobState
from jobspec.job import FailureClass, RetrySpec

__all__ = [
    "AttemptFacts",
    "Decision",
    "Failure",
    "FailureClass",
    "NodeEnd",
    "Outcome",
    "Policy",
    "Stop",
    "decide",
]


class Stop(enum.StrEnum):
    """Why a worker stopped its trainer (None when the trainer ended by itself)."""

    CANCEL = "cancel"
    PAUSE = "pause"
    MAX_RUNTIME = "max_runtime"
    SHUTDOWN = "shutdown"
    LOST = "lost"  # fenced out: the attempt is no longer this worker's (never recorded)
    HANG = "hang"  # no step progress for the hang timeout (a watcher decided)
    BUDGET = "budget"  # the job's cost reached `limits.max_cost` (a watcher decided)
    # the job yields its devices to one of higher priority (core.scheduling.preemption_apply)
    PREEMPT = "preempt"


@dataclass(frozen=True)
class Failure:
    """How an attempt failed: its class, a one-line reason, and where.

    `rank`: the global rank that failed first, when known; `log_tail`: its last log lines;
    `hints`: what the platform noticed that may explain it (a command argument naming a host
    path the job's sandbox does not show).
    """

    failure_class: FailureClass
    reason: str
    rank: int | None = None
    node_rank: int | None = None
    host: str | None = None
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The `failure` column / event data (JSON)."""
        return {
            "class": str(self.failure_class),
            "reason": self.reason,
            "rank": self.rank,
            "node_rank": self.node_rank,
            "host": self.host,
            "exit_code": self.exit_code,
            "log_tail": list(self.log_tail),
            "hints": list(self.hints),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Failure:
        return cls(
            failure_class=FailureClass(data["class"]),
            reason=str(data["reason"]),
            rank=data.get("rank"),
            node_rank=data.get("node_rank"),
            host=data.get("host"),
            exit_code=data.get("exit_code"),
            log_tail=tuple(data.get("log_tail") or ()),
            hints=tuple(data.get("hints") or ()),
        )


@dataclass(frozen=True)
class NodeEnd:
    """How one node's torchrun ended.

    `exit_code`: the failing rank's own code (the trainer's exit event or torchrun's error
    file), 0 when every rank succeeded; `stop`: why this node's worker stopped the trainer, if
    it did; `completed`: the reporting rank said `completed`; `failure`: set when the node
    failed (a non-zero exit the worker did not ask for, or `Stop.HANG`); `runtime_s`: seconds it
    trained (since the trainer's `running` report).
    """

    node_rank: int
    exit_code: int
    stop: Stop | None = None
    completed: bool = False
    failure: Failure | None = None
    runtime_s: float = 0.0


@dataclass(frozen=True)
class Policy:
    """The restart budget of a job (`retries` of its spec)."""

    max_restarts: int = 0
    on: Mapping[FailureClass, int] = field(default_factory=dict)
    retry_oom: bool = False
    max_total_restarts: int | None = None

    @classmethod
    def from_spec(cls, retries: RetrySpec) -> Policy:
        return cls(
            max_restarts=retries.max_restarts,
            on=dict(retries.on),
            retry_oom=retries.retry_oom,
            max_total_restarts=retries.max_total_restarts,
        )

    def budget(self, failure_class: FailureClass) -> int:
        """Restarts allowed for failures of `failure_class`."""
        if failure_class in self.on:
            return self.on[failure_class]
        if failure_class is FailureClass.USER_ERROR:
            return 0
        if failure_class is FailureClass.OOM and not self.retry_oom:
            return 0
        return self.max_restarts

    @property
    def cap(self) -> int:
        """Restarts of all classes together."""
        if self.max_total_restarts is not None:
            return self.max_total_restarts
        return max([self.max_restarts, *self.on.values()])


@dataclass(frozen=True)
class AttemptFacts:
    """Everything `decide` needs about one attempt's end.

    `state`: the job's state now (cancelling and pausing say what the user asked for);
    `ended`: the nodes that ended so far, the reporting one included; `lost`: set by the
    reconciler when a node went silent (its worker is gone; nothing else is known); `kind`: the
    job's (`jobspec.job.spec_kind`), which names what its success completed.
    """

    attempt: int
    state: JobState
    num_nodes: int
    ended: Sequence[NodeEnd]
    policy: Policy
    restarts_used: int = 0
    restarts_by_class: Mapping[str, int] = field(default_factory=dict)
    lost: Failure | None = None
    kind: str = "trainer"


#: What a job of each kind did when it succeeded (`Decision.message`, its `succeeded` event's).
COMPLETED = {"eval": "evaluation completed", "session": "session ended"}


class Outcome(enum.StrEnum):
    WAIT = "wait"  # other nodes are still running; the last to end decides
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    PAUSED = "paused"
    HAND_BACK = "hand_back"  # back to the queue, no budget used (worker shutdown, preemption)
    PREEMPTED = "preempted"  # back to the queue after a checkpoint for a higher priority job
    RESTART = "restart"  # back to the queue from the latest checkpoint; uses the budget
    FAILED = "failed"


@dataclass(frozen=True)
class Decision:
    """The answer: where the job goes, why, and what is recorded about the failure."""

    outcome: Outcome
    message: str
    failure: Failure | None = None
    limit: str | None = None  # the spec limit a FAILED without failure hit (`max_cost`, ...)

    @property
    def requeues(self) -> bool:
        return self.outcome in (Outcome.HAND_BACK, Outcome.RESTART, Outcome.PREEMPTED)


def decide(facts: AttemptFacts) -> Decision:
    """The next state of a job whose attempt `facts.attempt` (partly) ended. Pure."""
    if facts.lost is not None:
        return _after_failure(facts, facts.lost)
    failed = [n for n in facts.ended if n.failure is not None]
    if failed:
        return _after_failure(facts, failed[0].failure)  # type: ignore[arg-type]
    if len(facts.ended) < facts.num_nodes:
        return Decision(Outcome.WAIT, f"{len(facts.ended)} of {facts.num_nodes} nodes ended")
    stops = {n.stop for n in facts.ended if n.stop is not None}
    if all(n.exit_code == 0 for n in facts.ended) and any(n.completed for n in facts.ended):
        return Decision(Outcome.SUCCEEDED, COMPLETED.get(facts.kind, "training completed"))
    if facts.state == JobState.CANCELLING:
        return Decision(Outcome.CANCELLED, "cancelled")
    if facts.state == JobState.PAUSING:
        return Decision(Outcome.PAUSED, "paused after a checkpoint")
    if facts.state == JobState.PREEMPTING:
        return Decision(Outcome.PREEMPTED, "preempted: requeued after a checkpoint")
    if Stop.SHUTDOWN in stops:
        return Decision(
            Outcome.HAND_BACK, f"worker shutting down; attempt {facts.attempt} handed back"
        )
    if Stop.MAX_RUNTIME in stops:
        return Decision(Outcome.FAILED, "max_runtime_s exceeded", limit="max_runtime_s")
    if Stop.BUDGET in stops:
        return Decision(Outcome.FAILED, "budget: limits.max_cost reached", limit="max_cost")
    # Every node exited without a failure, a stop or a completion report: the code returned
    # early (a user script that exits 0 without finishing, a stop nobody asked for).
    code = next((n.exit_code for n in facts.ended if n.exit_code != 0), 0)
    reason = f"trainer exited with code {code} without reporting completion"
    return _after_failure(facts, Failure(FailureClass.USER_ERROR, reason, exit_code=code))


def _after_failure(facts: AttemptFacts, failure: Failure) -> Decision:
    """A failed attempt: what the user asked for wins, then preemption, then the budget."""
    if facts.state == JobState.CANCELLING:  # the ranks died of the stop itself, often
        return Decision(Outcome.CANCELLED, "cancelled")
    if facts.state == JobState.PAUSING:  # resume continues from the latest checkpoint
        return Decision(Outcome.PAUSED, "paused")
    if facts.state == JobState.PREEMPTING:  # as a pause, but back to the queue
        return Decision(Outcome.PREEMPTED, "preempted: requeued")
    cls = failure.failure_class
    what = f"attempt {facts.attempt} failed ({cls}): {failure.reason}"
    if cls is FailureClass.PREEMPTED:
        return Decision(Outcome.HAND_BACK, f"attempt {facts.attempt} preempted", failure)
    used = facts.restarts_by_class.get(str(cls), 0)
    budget, cap = facts.policy.budget(cls), facts.policy.cap
    if used < budget and facts.restarts_used < cap:
        left = min(budget - used, cap - facts.restarts_used) - 1
        return Decision(
            Outcome.RESTART,
            f"{what}; restarting from the latest checkpoint ({left} {cls} restarts left)",
            failure,
        )
    if used >= budget:
        why = f"no {cls} restarts left ({used} of {budget} used)"
    else:
        why = f"restart cap reached ({facts.restarts_used} of {cap})"
    return Decision(Outcome.FAILED, f"{what}; {why}", failure)
