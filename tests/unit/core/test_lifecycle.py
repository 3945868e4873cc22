"""`core.attempts.lifecycle_policy.decide`: the table of what an attempt's end means."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.attempts.lifecycle_policy import (
    AttemptFacts,
    Failure,
    FailureClass,
    NodeEnd,
    Outcome,
    Policy,
    Stop,
    decide,
)
from core.platform.tables import JobState
from jobspec.job import RetrySpec

C = FailureClass
RUNNING, CANCELLING, PAUSING = JobState.RUNNING, JobState.CANCELLING, JobState.PAUSING
PREEMPTING = JobState.PREEMPTING


def ok(node: int = 0, *, completed: bool = True) -> NodeEnd:
    return NodeEnd(node_rank=node, exit_code=0, completed=completed)


def failed(cls: FailureClass, node: int = 0, code: int = 1) -> NodeEnd:
    return NodeEnd(node_rank=node, exit_code=code, failure=Failure(cls, f"{cls} happened"))


def stopped(stop: Stop, node: int = 0, code: int = 0) -> NodeEnd:
    return NodeEnd(node_rank=node, exit_code=code, stop=stop)


def facts(
    *ended: NodeEnd,
    state: JobState = RUNNING,
    nodes: int = 1,
    policy: Policy | None = None,
    used: int = 0,
    by_class: dict[str, int] | None = None,
    lost: Failure | None = None,
) -> AttemptFacts:
    return AttemptFacts(
        attempt=1,
        state=state,
        num_nodes=nodes,
        ended=ended,
        policy=policy or Policy(max_restarts=2),
        restarts_used=used,
        restarts_by_class=by_class or {},
        lost=lost,
    )


LOST = Failure(C.NODE_LOST, "no heartbeat for 12 s")

TABLE: list[tuple[str, AttemptFacts, Outcome]] = [
    ("one node completed", facts(ok()), Outcome.SUCCEEDED),
    ("completed before the cancel arrived", facts(ok(), state=CANCELLING), Outcome.SUCCEEDED),
    ("gang: one of two ended well, wait", facts(ok(0), nodes=2), Outcome.WAIT),
    (
        "gang: both ended, one reported",
        facts(ok(0), ok(1, completed=False), nodes=2),
        Outcome.SUCCEEDED,
    ),
    ("gang: a failed node ends it at once", facts(failed(C.INFRA, 1), nodes=3), Outcome.RESTART),
    ("cancel stop", facts(stopped(Stop.CANCEL, code=1), state=CANCELLING), Outcome.CANCELLED),
    ("ranks died of the cancel", facts(failed(C.INFRA), state=CANCELLING), Outcome.CANCELLED),
    ("pause stop", facts(stopped(Stop.PAUSE), state=PAUSING), Outcome.PAUSED),
    ("preempt stop requeues", facts(stopped(Stop.PREEMPT), state=PREEMPTING), Outcome.PREEMPTED),
    (
        "ranks died of the preempt stop: requeued, no budget",
        facts(failed(C.INFRA), state=PREEMPTING, used=2, by_class={"infra": 2}),
        Outcome.PREEMPTED,
    ),
    (
        "completed before the preemption arrived",
        facts(ok(), state=PREEMPTING),
        Outcome.SUCCEEDED,
    ),
    (
        "gang: a preempted node waits for the others",
        facts(stopped(Stop.PREEMPT), state=PREEMPTING, nodes=2),
        Outcome.WAIT,
    ),
    ("shutdown hands back", facts(stopped(Stop.SHUTDOWN)), Outcome.HAND_BACK),
    ("shutdown ignores a spent budget", facts(stopped(Stop.SHUTDOWN), used=2), Outcome.HAND_BACK),
    ("max_runtime fails without a class", facts(stopped(Stop.MAX_RUNTIME)), Outcome.FAILED),
    ("max_cost fails without a class", facts(stopped(Stop.BUDGET)), Outcome.FAILED),
    ("a budget stop ignores restarts left", facts(stopped(Stop.BUDGET), used=0), Outcome.FAILED),
    (
        "gang: a budget stop waits for the other nodes",
        facts(stopped(Stop.BUDGET), nodes=2),
        Outcome.WAIT,
    ),
    ("infra restarts", facts(failed(C.INFRA)), Outcome.RESTART),
    ("hang restarts", facts(failed(C.HANG)), Outcome.RESTART),
    ("user_error is not retried by default", facts(failed(C.USER_ERROR)), Outcome.FAILED),
    ("oom is not retried by default", facts(failed(C.OOM)), Outcome.FAILED),
    (
        "oom with retry_oom",
        facts(failed(C.OOM), policy=Policy(max_restarts=1, retry_oom=True)),
        Outcome.RESTART,
    ),
    ("class budget spent", facts(failed(C.INFRA), used=2, by_class={"infra": 2}), Outcome.FAILED),
    (
        "another class's restarts do not count",
        facts(failed(C.HANG), used=1, by_class={"infra": 1}),
        Outcome.RESTART,
    ),
    (
        "per-class override above max_restarts",
        facts(
            failed(C.NODE_LOST),
            policy=Policy(max_restarts=0, on={C.NODE_LOST: 3}),
            used=2,
            by_class={"node_lost": 2},
        ),
        Outcome.RESTART,
    ),
    (
        "per-class override to 0",
        facts(failed(C.HANG), policy=Policy(max_restarts=5, on={C.HANG: 0})),
        Outcome.FAILED,
    ),
    (
        "user_error opted in",
        facts(failed(C.USER_ERROR), policy=Policy(on={C.USER_ERROR: 1})),
        Outcome.RESTART,
    ),
    (
        "global cap holds across classes",
        facts(
            failed(C.INFRA),
            policy=Policy(max_restarts=3, max_total_restarts=2),
            used=2,
            by_class={"hang": 1, "node_lost": 1},
        ),
        Outcome.FAILED,
    ),
    (
        "preempted hands back, whatever the budget",
        facts(failed(C.PREEMPTED), policy=Policy(max_restarts=0)),
        Outcome.HAND_BACK,
    ),
    ("exit 0 without completion is a user error", facts(ok(completed=False)), Outcome.FAILED),
    ("completed, then a crash", facts(NodeEnd(0, exit_code=1, completed=True)), Outcome.FAILED),
    ("lost node restarts", facts(lost=LOST), Outcome.RESTART),
    ("lost node while cancelling", facts(state=CANCELLING, lost=LOST), Outcome.CANCELLED),
    ("lost node while pausing", facts(state=PAUSING, lost=LOST), Outcome.PAUSED),
    ("lost node while preempting", facts(state=PREEMPTING, lost=LOST), Outcome.PREEMPTED),
    (
        "lost node, budget spent",
        facts(used=2, by_class={"node_lost": 2}, lost=LOST),
        Outcome.FAILED,
    ),
]


@pytest.mark.parametrize(
    ("facts_", "expected"), [(f, o) for _, f, o in TABLE], ids=[name for name, _, _ in TABLE]
)
def test_decide(facts_: AttemptFacts, expected: Outcome) -> None:
    assert decide(facts_).outcome is expected


def test_a_failure_carries_its_class_and_reason_into_the_decision() -> None:
    decision = decide(facts(failed(C.INFRA, node=1), nodes=2))
    assert decision.failure is not None and decision.failure.failure_class is C.INFRA
    assert "infra happened" in decision.message and "1 infra restarts left" in decision.message


def test_a_success_says_what_the_jobs_kind_completed() -> None:
    """An eval job trains nothing: its `succeeded` event says it evaluated."""
    assert decide(facts(ok())).message == "training completed"
    evaluated = decide(replace(facts(ok()), kind="eval"))
    assert (evaluated.outcome, evaluated.message) == (Outcome.SUCCEEDED, "evaluation completed")


def test_a_cancelled_or_paused_attempt_records_no_failure() -> None:
    assert decide(facts(failed(C.INFRA), state=CANCELLING)).failure is None
    assert decide(facts(failed(C.INFRA), state=PAUSING)).failure is None


def test_a_spent_budget_says_which_limit_stopped_it() -> None:
    by_class = facts(failed(C.INFRA), used=2, by_class={"infra": 2})
    assert "no infra restarts left (2 of 2 used)" in decide(by_class).message
    capped = facts(failed(C.INFRA), policy=Policy(max_restarts=3, max_total_restarts=1), used=1)
    assert "restart cap reached (1 of 1)" in decide(capped).message


def test_policy_from_the_spec_defaults() -> None:
    policy = Policy.from_spec(RetrySpec(max_restarts=2, on={C.HANG: 1}))
    budgets = {cls: policy.budget(cls) for cls in C}
    assert budgets == {
        C.OOM: 0,
        C.HANG: 1,
        C.NODE_LOST: 2,
        C.USER_ERROR: 0,
        C.INFRA: 2,
        C.PREEMPTED: 2,
    }
    assert policy.cap == 2
    assert Policy.from_spec(RetrySpec(max_restarts=1, on={C.INFRA: 4})).cap == 4


def test_failure_json_round_trips() -> None:
    failure = Failure(
        C.OOM, "CUDA out of memory", rank=3, node_rank=1, host="h", exit_code=1, log_tail=("a", "b")
    )
    assert Failure.from_json(failure.to_json()) == failure


def test_limit_stops_name_their_limit_and_carry_no_failure() -> None:
    budget = decide(facts(stopped(Stop.BUDGET)))
    assert (budget.limit, budget.failure) == ("max_cost", None)
    assert budget.message == "budget: limits.max_cost reached"
    assert decide(facts(stopped(Stop.MAX_RUNTIME))).limit == "max_runtime_s"
