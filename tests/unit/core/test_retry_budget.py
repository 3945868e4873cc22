"""The retry budget as shown to people: counted against the lifecycle's own budgets, and one
sentence that says why a failed job was not restarted."""

from __future__ import annotations

from typing import Any

import pytest

from core.attempts.retry_budget import retry_policy
from dataformat.failures import FailureClass as C
from jobspec.job import RetrySpec


def _policy(retries: dict[str, Any], by_class: dict[str, int], state: str, cls: C | None) -> Any:
    return retry_policy(
        retries=RetrySpec.model_validate(retries),
        restarts_used=sum(by_class.values()),
        restarts_by_class=by_class,
        state=state,
        failure_class=cls,
    )


@pytest.mark.parametrize(
    ("retries", "by_class", "state", "cls", "summary"),
    [
        ({}, {}, "failed", C.USER_ERROR, "no restarts allowed (the spec's `retries`)"),
        (
            {"max_restarts": 2},
            {},
            "running",
            None,
            "not restarted (hang 0/2, node_lost 0/2, infra 0/2, at most 2 in all)",
        ),
        (
            {"on": {"hang": 2}},
            {"hang": 2},
            "failed",
            C.HANG,
            "restarted 2 times (hang 2/2); no restarts left for hang",
        ),
        (
            {"on": {"hang": 2, "infra": 3}, "max_total_restarts": 2},
            {"hang": 1, "infra": 1},
            "failed",
            C.INFRA,
            "restarted 2 times (hang 1/2, infra 1/3, at most 2 in all); "
            "restart cap reached (2 of 2)",
        ),
        (
            {"on": {"infra": 1}, "retry_oom": True, "max_restarts": 1},
            {"infra": 1},
            "failed",
            C.USER_ERROR,
            "restarted once (oom 0/1, hang 0/1, node_lost 0/1, infra 1/1, at most 1 in all); "
            "user_error is not restarted (budget 0)",
        ),
    ],
)  # fmt: skip
def test_summary_says_what_the_policy_did(
    retries: dict[str, Any], by_class: dict[str, int], state: str, cls: C | None, summary: str
) -> None:
    assert _policy(retries, by_class, state, cls).summary == summary


def test_a_class_has_what_is_left_of_its_budget_and_of_the_cap() -> None:
    policy = _policy({"on": {"hang": 3, "infra": 3}, "max_total_restarts": 4}, {"infra": 3},
                     "running", C.INFRA)  # fmt: skip
    assert (policy.cap, policy.used, policy.left) == (4, 3, 1)
    assert policy.by_class[C.HANG].left == 1  # 3 of its own, but 1 under the cap
    assert policy.by_class[C.INFRA].left == 0
    assert C.PREEMPTED not in policy.by_class
