"""A session's built-in losses (`trainer.methods.session_losses`) against the Tinker
documentation's formulas, written here again token by token in plain Python floats on fixed
numbers: the value (a sum over tokens), the gradient in the policy's log-probabilities, the
per-datum `logprobs` output, padding, and the errors a client's mistake gets. PPO is also held
to GRPO's clipped term (`trainer.methods.grpo.per_token_loss`, itself tested against TRL)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from trainer.methods.grpo import per_token_loss
from trainer.methods.session_losses import (
    LOSS_FNS,
    LOSS_SUM,
    LossInputError,
    session_loss,
)

# One datum of six tokens: the policy's log-probabilities, the sampler's, advantages, weights.
# The ratios exp(p - q) run from ~0.37 to ~2.7, so both PPO thresholds and CISPO's cap bite.
POLICY = [-1.0, -0.5, -2.0, -0.1, -3.0, -1.5]
SAMPLER = [-1.2, -0.1, -1.0, -1.1, -2.9, -1.5]
ADVANTAGES = [1.0, -1.0, 0.5, 2.0, -0.5, 0.0]
WEIGHTS = [0.0, 0.0, 1.0, 1.0, 0.5, 1.0]
REL = 1e-6


def tensor(values: list[float], grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


def rl_inputs() -> dict[str, torch.Tensor]:
    return {"logprobs": tensor(SAMPLER), "advantages": tensor(ADVANTAGES)}


def clip(x: float, low: float, high: float) -> float:
    return min(max(x, low), high)


# Each loss per token, and its derivative in the policy's log-probability p, from the docs.
def expected(loss_fn: str, p: float, q: float, a: float, w: float) -> tuple[float, float]:
    r = math.exp(p - q)
    if loss_fn == "cross_entropy":
        return -p * w, -w
    if loss_fn == "importance_sampling":
        return -r * a, -r * a
    if loss_fn == "ppo":
        unclipped, clipped = r * a, clip(r, 0.8, 1.2) * a
        return -min(unclipped, clipped), (-r * a if unclipped <= clipped else 0.0)
    if loss_fn == "cispo":
        c = clip(r, 0.0, 4.0)
        return -c * p * a, -c * a
    beta = 0.05
    return -(p * a - 0.5 * beta * (p - q) ** 2), -(a - beta * (p - q))


def inputs_for(loss_fn: str) -> dict[str, torch.Tensor]:
    return {"weights": tensor(WEIGHTS)} if loss_fn == "cross_entropy" else rl_inputs()


def config_for(loss_fn: str) -> dict[str, float | str] | None:
    return {"beta": 0.05} if loss_fn == "dro" else None


@pytest.mark.parametrize("loss_fn", LOSS_FNS)
def test_each_loss_is_its_documented_formula_summed_over_tokens(loss_fn: str) -> None:
    policy = tensor(POLICY, grad=True)
    result = session_loss(loss_fn, policy, inputs_for(loss_fn), config_for(loss_fn))
    result.loss.backward()
    per_token = [
        expected(loss_fn, p, q, a, w)
        for p, q, a, w in zip(POLICY, SAMPLER, ADVANTAGES, WEIGHTS, strict=True)
    ]
    assert result.loss.item() == pytest.approx(sum(v for v, _ in per_token), rel=REL)
    assert result.metrics == {LOSS_SUM: pytest.approx(result.loss.item(), rel=1e-12)}
    assert policy.grad is not None
    assert policy.grad.tolist() == pytest.approx([g for _, g in per_token], rel=REL, abs=1e-12)
    assert result.logprobs.tolist() == POLICY and not result.logprobs.requires_grad


def test_ppo_clips_only_where_the_clipped_term_is_the_minimum() -> None:
    """Token 1 (r ~ 0.67, A < 0) and token 3 (r ~ 2.7, A > 0) are clipped: no gradient; token 2
    (r ~ 0.37, A > 0) is below the low threshold but its unclipped term is the minimum."""
    policy = tensor(POLICY, grad=True)
    session_loss("ppo", policy, rl_inputs()).loss.backward()
    assert policy.grad is not None
    grads = policy.grad.tolist()
    assert grads[1] == 0.0 and grads[3] == 0.0
    assert grads[2] == pytest.approx(-math.exp(-1.0) * 0.5, rel=REL)


def test_cispo_keeps_every_tokens_gradient_with_the_ratio_capped() -> None:
    policy = tensor(POLICY, grad=True)
    session_loss(
        "cispo", policy, rl_inputs(), {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    ).loss.backward()
    assert policy.grad is not None
    assert policy.grad[3].item() == pytest.approx(-1.2 * 2.0, rel=REL)  # r ~ 2.7 capped at 1.2
    assert policy.grad[1].item() == pytest.approx(-0.8 * -1.0, rel=REL)  # r ~ 0.67 raised to 0.8


def test_ppo_thresholds_come_from_loss_fn_config() -> None:
    wide = {"clip_low_threshold": 0.1, "clip_high_threshold": 10.0}
    default = session_loss("ppo", tensor(POLICY), rl_inputs()).loss.item()
    unclipped = session_loss("ppo", tensor(POLICY), rl_inputs(), wide).loss.item()
    plain = session_loss("importance_sampling", tensor(POLICY), rl_inputs()).loss.item()
    assert unclipped == pytest.approx(plain, rel=REL) and default != pytest.approx(plain)


def test_ppo_equals_grpos_clipped_term_with_epsilons_from_the_thresholds() -> None:
    """Tinker's thresholds are 1 - epsilon_low and 1 + epsilon_high of GRPO's (TRL's) term."""
    config = {"clip_low_threshold": 0.75, "clip_high_threshold": 1.28}
    ours = session_loss("ppo", tensor(POLICY), rl_inputs(), config).loss
    grpo, _, _ = per_token_loss(
        tensor(POLICY).unsqueeze(0),
        tensor(SAMPLER).unsqueeze(0),
        tensor(ADVANTAGES).unsqueeze(0),
        epsilon_low=0.25,
        epsilon_high=0.28,
    )
    assert ours.item() == pytest.approx(grpo.sum().item(), rel=1e-12)


@pytest.mark.parametrize("loss_fn", LOSS_FNS)
def test_a_padded_batch_sums_its_datums_and_padding_adds_nothing(loss_fn: str) -> None:
    """Datum 1 is the fixed one, datum 2 its first three tokens padded with garbage to six."""
    short = 3
    garbage = [5.0, -7.0, 3.0]

    def padded(values: list[float]) -> list[list[float]]:
        return [values, values[:short] + garbage]

    inputs = {key: torch.tensor(padded(t.tolist()), dtype=torch.float64)
              for key, t in inputs_for(loss_fn).items()}  # fmt: skip
    batch = torch.tensor(padded(POLICY), dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0] * 6, [1.0] * short + [0.0] * 3], dtype=torch.float64)
    result = session_loss(loss_fn, batch, inputs, config_for(loss_fn), mask=mask)
    result.loss.backward()

    one = session_loss(loss_fn, tensor(POLICY), inputs_for(loss_fn), config_for(loss_fn))
    part = session_loss(
        loss_fn,
        tensor(POLICY[:short]),
        {key: t[:short] for key, t in inputs_for(loss_fn).items()},
        config_for(loss_fn),
    )
    assert result.loss.item() == pytest.approx(one.loss.item() + part.loss.item(), rel=REL)
    assert batch.grad is not None and batch.grad[1, short:].abs().sum().item() == 0.0
    assert result.logprobs.shape == (2, 6)


def test_cross_entropy_takes_top_k_targets_with_their_weights() -> None:
    """Top-K distillation: (N, K) log-probabilities and weights, -sum_t sum_k w[t,k] lp[t,k]."""
    policy = torch.tensor([[-0.1, -2.5], [-0.7, -0.9]], dtype=torch.float64, requires_grad=True)
    weights = torch.tensor([[0.9, 0.1], [0.4, 0.6]], dtype=torch.float64)
    result = session_loss("cross_entropy", policy, {"weights": weights})
    result.loss.backward()
    assert result.loss.item() == pytest.approx(
        0.9 * 0.1 + 0.1 * 2.5 + 0.4 * 0.7 + 0.6 * 0.9, rel=REL
    )
    assert policy.grad is not None and torch.equal(policy.grad, -weights)


def test_every_problem_of_a_call_is_named_at_once() -> None:
    with pytest.raises(LossInputError) as caught:
        session_loss(
            "ppo",
            tensor(POLICY),
            {"logprobs": tensor(SAMPLER[:4])},
            {"clip_low_threshold": "tight", "epsilon": 0.2},
        )
    problems = caught.value.problems
    assert any("'advantages'" in p for p in problems)
    assert any("'logprobs'] has shape (4,)" in p for p in problems)
    assert any("no loss_fn_config key 'epsilon'" in p for p in problems)
    assert any("must be a number, got 'tight'" in p for p in problems)


@pytest.mark.parametrize(
    ("loss_fn", "config", "says"),
    [
        ("sft", None, "unknown loss_fn 'sft'"),
        ("dro", None, "dro needs loss_fn_config['beta']"),
        ("ppo", {"clip_low_threshold": 1.3}, "above clip_high_threshold"),
        ("importance_sampling", {"beta": 0.1}, "accepted: none"),
    ],
)
def test_a_loss_the_call_cannot_compute_is_the_clients_error(
    loss_fn: str, config: dict[str, float] | None, says: str
) -> None:
    with pytest.raises(LossInputError, match=re.escape(says)):
        session_loss(loss_fn, tensor(POLICY), rl_inputs(), config)
