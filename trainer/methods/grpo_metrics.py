"""What a GRPO step reports (`trainer.methods.grpo_train.GRPOMethod.step_metrics`): one float64
vector of sums per rank (`step_sums`), all-reduced once and turned into the metrics named in
`dataformat.metrics.GRPO_METRICS` (`metrics_of_sums`), and the group a `sample` event shows
(`sample_of`).

The rewards are the step's rollout's: with `num_iterations` > 1 the steps of one iteration
cycle train on the same completions, so they report the same `reward`, `reward/<grader>`,
`frac_reward_zero_std` and `completion_length` (as TRL logs its rewards once per generation
batch); `kl`, `clip_ratio/*` and `entropy` are each step's own."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from trainer.methods.grpo import STATISTICS
from trainer.methods.rollouts import Grader, Group

# A `sample` event's group: this many completions, each cut to this many characters (the
# prompt to its last ones).
MAX_SAMPLES = 8
SAMPLE_CHARS = 500
_LOSS_SUMS = len(STATISTICS) + 1  # `loss_statistics`' sums, then the entropy's
_REWARD_SUMS = 7


def step_sums(groups: Sequence[Group], loss_sums: Tensor, graders: Sequence[Grader]) -> Tensor:
    """(6 + 7 + 4 K,) float64 on `loss_sums`' device, K graders: `loss_sums` (the step's
    `loss_statistics` and entropy sums), then the rewards' sum, sum of squares and count,
    groups without spread, groups, completion tokens and completions, then per grader its
    scores' sum and count, then per grader this rank's cumulative `errors` and `timeouts`
    (`trainer.graders` counts them). Sums over ranks are the step's totals."""
    rewards = torch.cat([g.reward for g in groups if g.reward is not None])
    per_grader = torch.cat([g.rewards for g in groups])
    zero_std = sum(int(g.zero_std) for g in groups)
    lengths = torch.cat([g.mask.sum(1) for g in groups]).double()
    valid = ~torch.isnan(rewards)
    extra = [
        rewards[valid].double().sum(),
        (rewards[valid].double() ** 2).sum(),
        valid.sum().double(),
        torch.tensor(float(zero_std), dtype=torch.float64),
        torch.tensor(float(len(groups)), dtype=torch.float64),
        lengths.sum(),
        torch.tensor(float(lengths.numel()), dtype=torch.float64),
    ]
    for k in range(per_grader.shape[1]):
        column = per_grader[:, k]
        ok = ~torch.isnan(column)
        extra += [column[ok].double().sum(), ok.sum().double()]
    for grader in graders:
        for counter in ("errors", "timeouts"):
            extra.append(torch.tensor(float(getattr(grader, counter, 0)), dtype=torch.float64))
    return torch.cat([loss_sums, torch.stack([e.to(loss_sums) for e in extra])])


def metrics_of_sums(
    s: Sequence[float], graders: Sequence[Grader], *, beta: float
) -> dict[str, float]:
    """The step's metrics from the ranks' summed `step_sums` `s`: `reward`, `reward_std`,
    `reward/<grader>`, `frac_reward_zero_std`, `completion_length` (tokens), `kl` (only with
    `beta` > 0), `clip_ratio/*`, `entropy` (nats per completion token), and per grader
    `grader_errors/<grader>` and `grader_timeouts/<grader>` (since the attempt started)."""
    kl, low, high, region, tokens, entropy = s[:_LOSS_SUMS]
    total, squares, count, zero_std, groups, lengths, completions = s[
        _LOSS_SUMS : _LOSS_SUMS + _REWARD_SUMS
    ]
    metrics = {
        "reward": total / max(count, 1),
        "reward_std": math.sqrt(max(squares - total * total / count, 0.0) / (count - 1))
        if count > 1
        else 0.0,
        "frac_reward_zero_std": zero_std / max(groups, 1),
        "completion_length": lengths / max(completions, 1),
        "clip_ratio/low": low / max(tokens, 1),
        "clip_ratio/high": high / max(tokens, 1),
        "clip_ratio/region": region / max(tokens, 1),
        "entropy": entropy / max(tokens, 1),
    }
    if beta:
        metrics["kl"] = kl / max(tokens, 1)
    scores = _LOSS_SUMS + _REWARD_SUMS
    counts = scores + 2 * len(graders)
    for k, grader in enumerate(graders):
        score, scored = s[scores + 2 * k], s[scores + 2 * k + 1]
        metrics[f"reward/{grader.name}"] = score / scored if scored else float("nan")
        metrics[f"grader_errors/{grader.name}"] = s[counts + 2 * k]
        metrics[f"grader_timeouts/{grader.name}"] = s[counts + 2 * k + 1]
    return metrics


def sample_of(group: Group, decode: Callable[[list[int]], str]) -> list[dict[str, Any]]:
    """A `sample` event's completions of `group` (at most `MAX_SAMPLES`): each `{"prompt"
    (its last `SAMPLE_CHARS` characters), "completion" (its first), "reward"}`."""
    prompt = decode(group.prompt_ids.tolist())
    assert group.reward is not None  # set with the advantages
    return [
        {"prompt": prompt[-SAMPLE_CHARS:], "completion": text[:SAMPLE_CHARS], "reward": r}
        for text, r in zip(group.texts, group.reward.tolist(), strict=True)
    ][:MAX_SAMPLES]
