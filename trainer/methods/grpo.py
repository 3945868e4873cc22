"""GRPO's arithmetic: rewards to group-normalised advantages, and the clipped policy loss over
completion tokens, with the optional KL penalty to a reference.

Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300): each
prompt's `group_size` completions are scored, and a completion's advantage is its reward's
distance from its group's mean, so no value model is needed. The loss is PPO's clipped
surrogate (Schulman et al. 2017, arXiv:1707.06347) per completion token, with the ratio
r = exp(log pi(t) - log pi_old(t)) clipped to [1 - epsilon_low, 1 + epsilon_high] (DAPO's
"clip-higher", Yu et al. 2025, arXiv:2503.14476, when the two differ), plus
beta x the k3 estimator of KL(pi || pi_ref) (Schulman 2020, "Approximating KL divergence").

The formulas follow TRL's `GRPOTrainer` (trl 1.16, `_generate_and_score_completions` and
`_compute_loss`, the reference this module is tested against), with one difference of
scope: TRL normalises the `grpo` and `bnpo` losses by its local micro-batch and divides by the
accumulation steps; here every normaliser is the *global* one of the optimizer step
(`Normalisers`: completions and completion tokens over all micro-batches and ranks), so a
step's gradient does not depend on how its completions are split into micro-batches and
ranks, as for SFT's token sums and DPO's pairs. On one micro-batch of one rank they are TRL's
numbers.

Loss types (`loss_type`), for per-token losses l[i, t] over completion tokens (mask m[i, t]):
- `grpo`: mean over completions of each completion's token mean, sum_t l m / sum_t m (the
  paper's; biased toward short correct and long wrong answers).
- `dapo`: sum of l m over the step's tokens / the step's completion tokens (DAPO's token-level
  normalisation; TRL's default).
- `dr_grpo`: sum of l m / (completions x `max_completion_length`) (Dr. GRPO, Liu et al. 2025,
  arXiv:2503.20783: a constant normaliser, no length bias).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

LossType = Literal["grpo", "dapo", "dr_grpo"]
ScaleRewards = Literal["group", "batch", "none"]
LOSS_TYPES: tuple[LossType, ...] = ("grpo", "dapo", "dr_grpo")
SCALE_REWARDS: tuple[ScaleRewards, ...] = ("group", "batch", "none")
STD_EPS = 1e-4  # TRL's: advantages / (std + 1e-4)

# `loss_statistics`' sums, in order: the token-weighted ones over completion tokens, then the
# token count they are divided by.
STATISTICS = ("kl", "clip_ratio/low", "clip_ratio/high", "clip_ratio/region", "tokens")


def combine_rewards(rewards_per_grader: Tensor, weights: Tensor | None = None) -> Tensor:
    """One reward per completion: the graders' weighted sum.

    rewards_per_grader: (N, G) fp32, NaN where a grader could not score; weights: (G,), ones
    when None. Returns (N,) fp32; NaN for a completion no grader scored (TRL's `nansum` then
    NaN for all-NaN rows: such a completion is left out of its group's statistics and gets
    advantage 0, `group_advantages`). Raises `ValueError` on mismatched shapes."""
    if rewards_per_grader.dim() != 2:
        raise ValueError(
            f"rewards_per_grader must be (N, G), got {tuple(rewards_per_grader.shape)}"
        )
    num_graders = rewards_per_grader.shape[1]
    if weights is None:
        weights = torch.ones(num_graders, dtype=rewards_per_grader.dtype)
    if weights.shape != (num_graders,):
        raise ValueError(f"{num_graders} graders but weights of shape {tuple(weights.shape)}")
    weights = weights.to(rewards_per_grader)
    rewards = (rewards_per_grader * weights.unsqueeze(0)).nansum(dim=1)
    return rewards.masked_fill(torch.isnan(rewards_per_grader).all(dim=1), float("nan"))


def nanstd(values: Tensor, dim: int | None = None) -> Tensor:
    """Bessel-corrected standard deviation ignoring NaNs (NaN where fewer than two values),
    along `dim` (all values when None)."""
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim)
    count = (~torch.isnan(values)).sum(dim=dim)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, torch.nan))
    return torch.sqrt(variance * correction)


def group_advantages(
    rewards: Tensor, group_size: int, scale_rewards: ScaleRewards = "group"
) -> tuple[Tensor, Tensor]:
    """Group-relative advantages of N = prompts x `group_size` completions.

    rewards: (N,) fp32, the `group_size` completions of one prompt consecutive; NaN for an
    unscorable completion (left out of its group's mean and std; its advantage is 0).
    `scale_rewards`: `group` divides by the group's std (the paper), `batch` by the whole
    batch's (PPO-Lite), `none` not at all (Dr. GRPO: the std scaling favours too easy and too
    hard prompts); always + 1e-4. Returns (advantages (N,) fp32, zero_std (N,) bool: the
    completion's group (or batch, for `batch`) had no reward spread, so it carries no signal;
    the fraction is a metric). Raises `ValueError` when N is not a multiple of `group_size`."""
    if group_size < 1 or rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"{tuple(rewards.shape)} rewards are not whole groups of {group_size} completions"
        )
    grouped = rewards.view(-1, group_size)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(group_size)
    if scale_rewards == "batch":
        std = (nanstd(rewards) if rewards.numel() > 1 else torch.zeros(())).expand_as(rewards)
    elif group_size > 1:
        std = nanstd(grouped, dim=1).repeat_interleave(group_size)
    else:
        std = torch.zeros_like(rewards)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + STD_EPS)
    zero_std = torch.isclose(std, torch.zeros_like(std))
    return torch.nan_to_num(advantages, nan=0.0), zero_std


@dataclass(frozen=True)
class Normalisers:
    """The optimizer step's totals a loss is divided by, over every micro-batch and rank:
    `completions` and `tokens` (completion tokens under the mask); `max_completion_length`
    (tokens, the sampling limit) for `dr_grpo`."""

    completions: int
    tokens: int
    max_completion_length: int


def per_token_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    ref_logps: Tensor | None = None,
    beta: float = 0.0,
    kl_bias_correction: bool = True,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The clipped surrogate per completion token, with the KL penalty.

    logps, old_logps, ref_logps: (B, T) fp32 log-probabilities (nats) of each completion token
    under the policy being trained (with grad), the policy that sampled it (no grad; equal to
    `logps.detach()` on the first of `num_iterations` updates) and the reference; advantages:
    (B,) or (B, T). `kl_bias_correction`: the KL term is weighted by the ratio r (with its
    grad), which makes its gradient the unbiased reverse-KL gradient for samples of pi_old
    (DeepSeek-V3.2, arXiv:2512.02556; TRL's `use_bias_correction_kl`, its default). Returns
    (loss (B, T): -min(r A, clip(r) A) + beta KL, ratio r (B, T), per-token KL (B, T) or None
    when `beta` is 0). Masking is the caller's (`aggregate`). Raises `ValueError` when `beta`
    is set without `ref_logps`."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    loss = -torch.min(ratio * advantages, clipped * advantages)
    kl = None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs the reference's log-probabilities")
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1  # k3: unbiased, >= 0
        if kl_bias_correction:
            kl = kl * ratio
        loss = loss + beta * kl
    return loss, ratio, kl


def aggregate(loss: Tensor, mask: Tensor, loss_type: LossType, norm: Normalisers) -> Tensor:
    """This micro-batch's share of the step's loss (0-dim): its completions' per-token `loss`
    (B, T) under `mask` (B, T) (1 on completion tokens, 0 on padding and past the stop)
    summed as `loss_type` says and divided by the step's global `norm`. The shares of all
    micro-batches and ranks add up to the step's loss. Raises `ValueError` on an unknown
    `loss_type`."""
    mask = mask.to(loss.dtype)
    if loss_type == "grpo":
        per_completion = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_completion.sum() / max(norm.completions, 1)
    if loss_type == "dapo":
        return (loss * mask).sum() / max(norm.tokens, 1)
    if loss_type == "dr_grpo":
        return (loss * mask).sum() / max(norm.completions * norm.max_completion_length, 1)
    raise ValueError(f"unknown GRPO loss_type {loss_type!r}")


@torch.no_grad()
def loss_statistics(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    kl: Tensor | None = None,
) -> Tensor:
    """(5,) float64 sums over this micro-batch's completion tokens, named `STATISTICS`: KL
    (0 without a reference), tokens whose ratio was clipped below (negative advantage),
    above (positive advantage), either, and the number of tokens; summed over micro-batches
    and ranks, the first four over the last are the step's token means (TRL's `kl`,
    `clip_ratio/low_mean`, `clip_ratio/high_mean`, `clip_ratio/region_mean`)."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    m = mask.to(torch.float64)
    low = (ratio < 1 - epsilon_low) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    kl_sum = (kl.double() * m).sum() if kl is not None else torch.zeros((), dtype=torch.float64)
    return torch.stack(
        [
            kl_sum.to(m.device),
            (low.double() * m).sum(),
            (high.double() * m).sum(),
            ((low | high).double() * m).sum(),
            m.sum(),
        ]
    )


def token_logps(logits: Tensor, targets: Tensor) -> Tensor:
    """(B, T) fp32 log-probabilities (nats) of `targets` (B, T) int64 under `logits`
    (B, T, V), each position's target already shifted to it; the log-softmax is taken row by
    row in fp32 so the temporaries stay (T, V)."""
    if logits.shape[:2] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}"
        )
    rows = [
        torch.log_softmax(row.float(), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        for row, ids in zip(logits, targets, strict=True)
    ]
    return torch.stack(rows)


def token_entropy(logits: Tensor) -> Tensor:
    """(B, T) fp32 entropy (nats) of each position's next-token distribution `logits`
    (B, T, V), without grad (a metric)."""
    with torch.no_grad():
        rows = []
        for row in logits:
            logp = torch.log_softmax(row.float(), dim=-1)
            rows.append(-(logp.exp() * logp).sum(-1))
        return torch.stack(rows)
