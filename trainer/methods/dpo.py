"""Direct Preference Optimization: the per-pair loss, the implicit rewards and their metrics.

DPO (Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model is Secretly a
Reward Model", arXiv:2305.18290, eq. 7) trains a policy pi_theta on pairs (x, y_w, y_l) of a
prompt with a chosen and a rejected answer, against a frozen reference pi_ref:

    h = [log pi_theta(y_w|x) - log pi_ref(y_w|x)] - [log pi_theta(y_l|x) - log pi_ref(y_l|x)]
    loss_sigmoid = -log sigmoid(beta h)

`log pi(y|x)` is the sum over the answer's tokens of the token log-probabilities (prompt and
padding excluded: the rows' `labels` are -100 there). The implicit reward of an answer is
beta x its log-ratio (the paper's section 5); a pair is "accurate" when the chosen answer's
reward exceeds the rejected one's. The formulas follow TRL's `DPOTrainer`
(huggingface/trl, trl/trainer/dpo_trainer.py): `dpo_loss` of v0.28 for the conservative
(cDPO) label smoothing of the sigmoid loss, `_compute_loss` of v1.9 for IPO's length
normalisation and for the reported metrics (rewards from the summed log-ratios).

Only torch; no model, data or process-group code lives here except the metric all-reduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dataformat.metrics import DPO_METRICS
from trainer.data.rows import IGNORE_INDEX
from trainer.distributed import DistInfo, all_reduce_sum

# Order of the per-pair statistics summed by `pair_statistics` (then divided by the pairs).
METRICS = DPO_METRICS


def sequence_logps(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Summed log-probabilities of each row's supervised tokens, and their number.

    logits: (B, T, V), any float dtype; labels: (B, T) int64, already shifted (`labels[b, t]`
    is the target of position t), `-100` where not supervised. Returns (logps (B,) fp32 in
    nats, num_tokens (B,) int64). Only the supervised positions' logits are gathered and
    cast to fp32 before the log-softmax, so the fp32 temporaries scale with the answer
    tokens, not with B x T x V (the prompt is usually most of a preference row).
    """
    if logits.shape[:2] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    mask = labels != IGNORE_INDEX
    rows = mask.nonzero(as_tuple=True)[0]  # (n,) row of each supervised position
    token_logps = -F.cross_entropy(logits[mask].float(), labels[mask], reduction="none")
    logps = torch.zeros(labels.shape[0], dtype=torch.float32, device=logits.device)
    return logps.index_add(0, rows, token_logps), mask.sum(dim=1)


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    *,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    chosen_tokens: Tensor | None = None,
    rejected_tokens: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-pair DPO losses and the implicit rewards of both answers.

    All four log-probability inputs are (B,) summed answer log-probabilities in nats
    (`sequence_logps`; the reference's carry no gradient). Returns (losses (B,),
    chosen_rewards (B,), rejected_rewards (B,)); the rewards are beta x (policy - reference)
    log-ratios, detached.

    - `sigmoid` (DPO eq. 7), with the conservative DPO of Mitchell (2023, "A note on DPO with
      noisy preferences") when `label_smoothing` e > 0, as TRL's v0.28 `dpo_loss`:
      -(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h).
    - `ipo` (Azar et al. 2023, arXiv:2310.12036, eq. 17, tau = beta): (h' - 1 / (2 beta))^2
      where h' uses each answer's log-ratio divided by its token count (`chosen_tokens`,
      `rejected_tokens`, (B,), required), as TRL v1.9's `_compute_loss` does.

    Raises `ValueError` for an unknown `loss_type`, IPO without token counts, or label
    smoothing outside [0, 0.5) or with IPO.
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing {label_smoothing} is outside [0, 0.5)")
    chosen_logratios = policy_chosen - ref_chosen
    rejected_logratios = policy_rejected - ref_rejected
    if loss_type == "sigmoid":
        h = chosen_logratios - rejected_logratios
        losses = -F.logsigmoid(beta * h) * (1.0 - label_smoothing)
        if label_smoothing:
            losses = losses - F.logsigmoid(-beta * h) * label_smoothing
    elif loss_type == "ipo":
        if chosen_tokens is None or rejected_tokens is None:
            raise ValueError("the ipo loss needs chosen_tokens and rejected_tokens")
        if label_smoothing:
            raise ValueError("label_smoothing applies to the sigmoid loss only")
        h = chosen_logratios / chosen_tokens.clamp(min=1) - rejected_logratios / (
            rejected_tokens.clamp(min=1)
        )
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; expected 'sigmoid' or 'ipo'")
    return losses, beta * chosen_logratios.detach(), beta * rejected_logratios.detach()


def pair_statistics(
    losses: Tensor,
    chosen_rewards: Tensor,
    rejected_rewards: Tensor,
    policy_chosen: Tensor,
    policy_rejected: Tensor,
) -> Tensor:
    """Sums over a micro-batch's pairs of the `METRICS`, then the pair count: (len(METRICS)
    + 1,) float64, detached. Add them up over micro-batches and ranks, then `mean_metrics`."""
    margin = chosen_rewards - rejected_rewards
    columns = (
        losses.detach(),
        chosen_rewards,
        rejected_rewards,
        margin,
        (margin > 0).float(),  # TRL: chosen_rewards > rejected_rewards
        policy_chosen.detach(),
        policy_rejected.detach(),
    )
    sums = torch.stack([c.double().sum() for c in columns])
    count = torch.tensor([losses.numel()], dtype=torch.float64, device=losses.device)
    return torch.cat([sums, count])


def mean_metrics(sums: Tensor, dist: DistInfo) -> dict[str, float]:
    """All ranks: the means over the global batch's pairs of the `METRICS` from this rank's
    `pair_statistics` sums ((len(METRICS) + 1,) float64; all-reduced over every rank, so a
    data-parallel rank must hold distinct pairs). Raises `ValueError` when there is no pair."""
    total = all_reduce_sum(sums.clone(), dist).tolist()
    count = total[-1]
    if count <= 0:
        raise ValueError("no preference pair was scored")
    return {name: value / count for name, value in zip(METRICS, total[:-1], strict=True)}
