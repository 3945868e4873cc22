"""The built-in losses of a training session's `forward_backward` (issue 47): the Tinker API's
`cross_entropy`, `importance_sampling`, `ppo`, `cispo` and `dro`, as the official client
(`tinker==0.38.0`) names them and its documentation defines them.

Source: the Tinker documentation's loss pages (tinker-docs.thinkingmachines.ai, "Loss
Functions": cross-entropy, importance sampling, PPO, CISPO, DRO), which give each loss as torch
code over `target_logprobs` (the policy being trained, with grad) and `sampling_logprobs` (the
datum's `logprobs` input: the sampler's log-probabilities, no grad). The client's own source
names the losses (`tinker/types/loss_fn_type.py`) and the float input keys
(`tinker/types/_pydantic_types/datum.py`) but holds no formula; docs/TINKER-WIRE.md,
'Loss functions' lists what comes from where. Every loss is a *sum* over tokens (and over the
datums of the call), never a mean: the client reports `loss:sum` and sums it across the chunks
of one call (`tinker/lib/chunked_fwdbwd_helpers.py`, the `:sum` reduction).

With r = exp(target_logprobs - sampling_logprobs) the importance ratio and A the advantages:
- `cross_entropy`: sum(-target_logprobs * weights). Inputs may be (N,) or (N, K) (top-K
  distillation: K candidate targets per position, each with its weight).
- `importance_sampling`: sum(-r * A) (REINFORCE with an importance weight).
- `ppo`: sum(-min(r A, clip(r, low, high) A)) (Schulman et al. 2017, arXiv:1707.06347);
  `low`/`high` are absolute ratio thresholds (`clip_low_threshold`, `clip_high_threshold`),
  not epsilons: 0.8 and 1.2 by default (the docs' "epsilon fixed to 0.2").
- `cispo`: sum(-sg(clip(r, low, high)) * target_logprobs * A) (MiniMax-M1, arXiv:2506.13585):
  the clipped ratio is a detached coefficient, so no token loses its gradient; by default
  one-sided, low 0.0 and high 4.0 (the docs' tutorial 202).
- `dro`: sum(-(target_logprobs * A - beta/2 * (target_logprobs - sampling_logprobs)^2))
  (Richemond et al. 2024, arXiv:2405.19107). `beta` has no default the client or its docs
  state, so it is required.

The server gathers `target_logprobs` from the model's logits at `target_tokens`
(`trainer.methods.grpo.token_logps`) and calls `session_loss`; what it returns per datum is
`logprobs` (the detached `target_logprobs`) and, for the call, the metric `loss:sum`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

LossFn = Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]
LOSS_FNS: tuple[LossFn, ...] = get_args(LossFn)

# The `loss_fn_inputs` keys each loss reads besides `target_tokens` (which the server has
# already turned into `target_logprobs`).
LOSS_INPUTS: dict[LossFn, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
}
# The `loss_fn_config` keys each loss accepts, with their defaults (None: required).
LOSS_CONFIG: dict[LossFn, dict[str, float | None]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": None},
}
LOSS_SUM = "loss:sum"  # the metric's name; the suffix is the client's reduction across chunks


class LossInputError(ValueError):
    """A `forward_backward` call the loss cannot compute: an unknown loss, a missing or
    misshapen input, an unknown or non-numeric config value. The client's mistake (a Tinker
    error of category `user`); `problems` lists every one found, not only the first."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class LossResult:
    """loss: the scalar to call `backward()` on (the sum over tokens, with grad); logprobs: the
    detached `target_logprobs`, shaped as given, the per-datum `logprobs` output; metrics:
    `{"loss:sum": loss}` as a float."""

    loss: Tensor
    logprobs: Tensor
    metrics: dict[str, float]


def cross_entropy(target_logprobs: Tensor, weights: Tensor) -> Tensor:
    """Per-token weighted negative log-likelihood, -target_logprobs * weights.

    target_logprobs: (..., T) or (..., T, K) fp32 log-probabilities (nats) of the target
    tokens under the policy, with grad; weights: same shape (0 for prompt tokens, 1 for
    trained ones; teacher probabilities for top-K distillation). Returns the same shape."""
    return -target_logprobs * weights


def importance_sampling(
    target_logprobs: Tensor, sampling_logprobs: Tensor, advantages: Tensor
) -> Tensor:
    """Per-token importance-weighted policy gradient, -exp(target - sampling) * advantages.

    All three (..., T) fp32; log-probabilities in nats, `sampling_logprobs` the sampler's (no
    grad). Returns (..., T). Its gradient in `target_logprobs` is -r A."""
    ratio = torch.exp(target_logprobs - sampling_logprobs)
    return -(ratio * advantages)


def ppo(
    target_logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    *,
    clip_low_threshold: float,
    clip_high_threshold: float,
) -> Tensor:
    """Per-token clipped surrogate, -min(r A, clip(r, low, high) A), r = exp(target - sampling).

    Shapes as `importance_sampling`; the thresholds bound the ratio itself (0.8 and 1.2 mean
    epsilon 0.2). Returns (..., T); a token whose clipped term is the minimum has no gradient."""
    ratio = torch.exp(target_logprobs - sampling_logprobs)
    clipped = torch.clamp(ratio, clip_low_threshold, clip_high_threshold)
    return -torch.min(ratio * advantages, clipped * advantages)


def cispo(
    target_logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    *,
    clip_low_threshold: float,
    clip_high_threshold: float,
) -> Tensor:
    """Per-token clipped-ratio policy gradient, -sg(clip(r, low, high)) * target_logprobs * A.

    Shapes as `importance_sampling`. The clipped ratio is detached: the gradient in
    `target_logprobs` is -clip(r) A at every token, never 0. Returns (..., T)."""
    ratio = torch.exp(target_logprobs - sampling_logprobs)
    coefficient = torch.clamp(ratio, clip_low_threshold, clip_high_threshold).detach()
    return -(coefficient * target_logprobs * advantages)


def dro(
    target_logprobs: Tensor, sampling_logprobs: Tensor, advantages: Tensor, *, beta: float
) -> Tensor:
    """Per-token DRO loss, -(target_logprobs * A - beta / 2 * (target - sampling)^2).

    Shapes as `importance_sampling`; `beta` weighs the quadratic penalty on the log-ratio.
    Returns (..., T); the gradient in `target_logprobs` is -(A - beta (target - sampling))."""
    quadratic = (target_logprobs - sampling_logprobs) ** 2
    return -(target_logprobs * advantages - 0.5 * beta * quadratic)


def session_loss(
    loss_fn: str,
    target_logprobs: Tensor,
    inputs: Mapping[str, Tensor],
    config: Mapping[str, float | str] | None = None,
    *,
    mask: Tensor | None = None,
) -> LossResult:
    """One `forward_backward` call's loss: `loss_fn` on the policy's `target_logprobs` and the
    datums' `loss_fn_inputs`, summed over every token.

    target_logprobs: (T,) for one datum, (B, T) for a padded batch, or (T, K) / (B, T, K) for
    `cross_entropy`'s top-K targets; fp32 nats, with grad. inputs: the `loss_fn_inputs` tensors
    by key (`LOSS_INPUTS`), each the shape of `target_logprobs` (extra keys, such as
    `target_tokens`, are ignored). config: `loss_fn_config` (`LOSS_CONFIG` gives the keys and
    defaults). mask: the shape of `target_logprobs`, 1 for real tokens and 0 for padding (None:
    all real); padding adds nothing to the loss or the gradient.
    Returns a `LossResult`. Raises `LossInputError` listing every problem with the call."""
    if loss_fn not in LOSS_FNS:
        raise LossInputError([f"unknown loss_fn {loss_fn!r}; one of {', '.join(LOSS_FNS)}"])
    name: LossFn = loss_fn  # narrowed by the membership test above
    problems = _input_problems(name, target_logprobs, inputs, mask)
    settings, config_problems = _config(name, config or {})
    problems += config_problems
    if problems:
        raise LossInputError(problems)

    sampling = inputs.get("logprobs")
    advantages = inputs.get("advantages")
    if name == "cross_entropy":
        per_token = cross_entropy(target_logprobs, inputs["weights"])
    elif name == "importance_sampling":
        assert sampling is not None and advantages is not None
        per_token = importance_sampling(target_logprobs, sampling, advantages)
    elif name in ("ppo", "cispo"):
        assert sampling is not None and advantages is not None
        clipped = ppo if name == "ppo" else cispo
        per_token = clipped(
            target_logprobs,
            sampling,
            advantages,
            clip_low_threshold=settings["clip_low_threshold"],
            clip_high_threshold=settings["clip_high_threshold"],
        )
    else:
        assert sampling is not None and advantages is not None
        per_token = dro(target_logprobs, sampling, advantages, beta=settings["beta"])
    if mask is not None:
        per_token = per_token * mask
    loss = per_token.sum()
    return LossResult(loss=loss, logprobs=target_logprobs.detach(), metrics={LOSS_SUM: loss.item()})


def _input_problems(
    name: LossFn, target_logprobs: Tensor, inputs: Mapping[str, Tensor], mask: Tensor | None
) -> list[str]:
    shape = tuple(target_logprobs.shape)
    problems = []
    if name != "cross_entropy" and target_logprobs.dim() > 2:
        problems.append(f"{name} takes (T,) or (B, T) log-probabilities, got {shape}")
    for key in LOSS_INPUTS[name]:
        if key not in inputs:
            problems.append(f"{name} needs loss_fn_inputs[{key!r}]")
        elif tuple(inputs[key].shape) != shape:
            problems.append(
                f"loss_fn_inputs[{key!r}] has shape {tuple(inputs[key].shape)}, "
                f"target_tokens {shape}"
            )
    if mask is not None and tuple(mask.shape) != shape:
        problems.append(f"mask has shape {tuple(mask.shape)}, target_logprobs {shape}")
    return problems


def _config(name: LossFn, config: Mapping[str, float | str]) -> tuple[dict[str, float], list[str]]:
    """`config` over `LOSS_CONFIG[name]`'s defaults, and the problems with it."""
    accepted = LOSS_CONFIG[name]
    problems = []
    for key in sorted(set(config) - set(accepted)):
        known = ", ".join(accepted) if accepted else "none"
        problems.append(f"{name} has no loss_fn_config key {key!r} (accepted: {known})")
    settings: dict[str, float] = {}
    for key, default in accepted.items():
        value = config.get(key, default)
        if value is None:
            problems.append(f"{name} needs loss_fn_config[{key!r}]")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(f"loss_fn_config[{key!r}] must be a number, got {value!r}")
        else:
            settings[key] = float(value)
    low, high = settings.get("clip_low_threshold"), settings.get("clip_high_threshold")
    if low is not None and high is not None and low > high:
        problems.append(f"clip_low_threshold {low} is above clip_high_threshold {high}")
    return settings, problems
