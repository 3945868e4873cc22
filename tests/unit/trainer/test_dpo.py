"""DPO's loss, rewards and metrics against the papers' formulas, computed independently here.

The independent computation takes each token's log-probability from a float64 log-softmax,
sums the answer tokens one by one, and evaluates the losses in Python floats (`math`):

    sigmoid (Rafailov et al. 2023, eq. 7; cDPO with label smoothing e, as TRL v0.28):
        h = (pi_c - ref_c) - (pi_r - ref_r)
        loss = (1 - e) log(1 + exp(-beta h)) + e log(1 + exp(beta h))
    ipo (Azar et al. 2023, eq. 17, log-ratios per answer token, as TRL v1.9):
        loss = ((pi_c - ref_c) / n_c - (pi_r - ref_r) / n_r - 1 / (2 beta))^2
    rewards = beta (pi - ref); accuracy = [reward_c > reward_r]

Tolerance, derived from fp32's eps = 2^-23 ~ 1.19e-7: the fp32 log-softmax of one token is
accurate to a few ulps of |logit| + log V, and summing n token terms adds up to n ulps of the
sum, so a sequence log-prob is within 16 eps x sum over its tokens of (max |logit| + log V). The
loss moves by at most beta (sigmoid) or 2 |h' - 1/(2 beta)| / n (IPO) per unit of h, plus 4
eps of its own magnitude for the final fp32 operations.
"""

from __future__ import annotations

import math

import pytest
import torch

from trainer.data.rows import IGNORE_INDEX
from trainer.distributed import DistInfo
from trainer.methods.dpo import METRICS, dpo_loss, mean_metrics, pair_statistics, sequence_logps

EPS32 = torch.finfo(torch.float32).eps
B, T, V = 6, 12, 17
WORLD_OF_ONE = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _random_pair_batch(seed: int) -> dict[str, torch.Tensor]:
    """Policy and reference logits for B pairs (chosen rows, then rejected rows) and labels
    supervising an answer of 2..7 tokens after a prompt of 3 tokens, then padding."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.full((2 * B, T), IGNORE_INDEX, dtype=torch.long)
    for row in range(2 * B):
        length = int(torch.randint(2, 8, (1,), generator=gen))
        labels[row, 3 : 3 + length] = torch.randint(0, V, (length,), generator=gen)
    policy = 3.0 * torch.randn(2 * B, T, V, generator=gen)
    reference = policy + 0.5 * torch.randn(2 * B, T, V, generator=gen)
    return {"labels": labels, "policy": policy, "reference": reference}


def _independent_logps(logits: torch.Tensor, labels: torch.Tensor) -> list[tuple[float, float]]:
    """(summed log-prob, its fp32 error bound) per row, token by token in float64."""
    out = []
    for row in range(logits.shape[0]):
        total, bound = 0.0, 0.0
        for t in range(logits.shape[1]):
            target = int(labels[row, t])
            if target == IGNORE_INDEX:
                continue
            logp = torch.log_softmax(logits[row, t].double(), dim=-1)[target]
            total += float(logp)
            bound += 16 * EPS32 * (float(logits[row, t].abs().max()) + math.log(V))
        out.append((total, bound))
    return out


def _softplus(x: float) -> float:
    return math.log1p(math.exp(-abs(x))) + max(x, 0.0)


def _expected(batch: dict[str, torch.Tensor], beta: float, loss_type: str, smoothing: float):
    pol = _independent_logps(batch["policy"], batch["labels"])
    ref = _independent_logps(batch["reference"], batch["labels"])
    tokens = (batch["labels"] != IGNORE_INDEX).sum(dim=1).tolist()
    rows = []
    for i in range(B):
        j = B + i  # the rejected row of pair i
        ratio_c, ratio_r = pol[i][0] - ref[i][0], pol[j][0] - ref[j][0]
        h_bound = pol[i][1] + ref[i][1] + pol[j][1] + ref[j][1]
        if loss_type == "sigmoid":
            h = ratio_c - ratio_r
            loss = (1 - smoothing) * _softplus(-beta * h) + smoothing * _softplus(beta * h)
            loss_bound = beta * h_bound
        else:
            h = ratio_c / tokens[i] - ratio_r / tokens[j]
            loss = (h - 1 / (2 * beta)) ** 2
            loss_bound = 2 * abs(h - 1 / (2 * beta)) * h_bound / min(tokens[i], tokens[j])
        rows.append(
            {
                "loss": (loss, loss_bound + 4 * EPS32 * loss),
                "chosen_reward": (beta * ratio_c, beta * (pol[i][1] + ref[i][1])),
                "rejected_reward": (beta * ratio_r, beta * (pol[j][1] + ref[j][1])),
                "logps_chosen": pol[i],
                "logps_rejected": pol[j],
            }
        )
    return rows


def _ours(batch: dict[str, torch.Tensor], beta: float, loss_type: str, smoothing: float):
    pol, tokens = sequence_logps(batch["policy"], batch["labels"])
    ref, _ = sequence_logps(batch["reference"], batch["labels"])
    pc, pr = pol.chunk(2)
    rc, rr = ref.chunk(2)
    tc, tr = tokens.chunk(2)
    losses, chosen_rewards, rejected_rewards = dpo_loss(
        pc, pr, rc, rr, beta=beta, loss_type=loss_type, label_smoothing=smoothing,
        chosen_tokens=tc, rejected_tokens=tr,
    )  # fmt: skip
    return losses, chosen_rewards, rejected_rewards, pc, pr


CASES = [
    ("sigmoid", 0.1, 0.0),
    ("sigmoid", 0.5, 0.0),
    ("sigmoid", 0.1, 0.2),
    ("sigmoid", 0.3, 0.45),
    ("ipo", 0.1, 0.0),
    ("ipo", 1.0, 0.0),
]


@pytest.mark.parametrize(("loss_type", "beta", "smoothing"), CASES)
def test_loss_and_rewards_equal_the_papers_formulas_computed_independently(
    loss_type: str, beta: float, smoothing: float
) -> None:
    batch = _random_pair_batch(seed=7)
    losses, chosen_rewards, rejected_rewards, pc, pr = _ours(batch, beta, loss_type, smoothing)
    expected = _expected(batch, beta, loss_type, smoothing)
    assert losses.dtype == torch.float32 and losses.shape == (B,)
    got = {
        "loss": losses,
        "chosen_reward": chosen_rewards,
        "rejected_reward": rejected_rewards,
        "logps_chosen": pc,
        "logps_rejected": pr,
    }
    for i, row in enumerate(expected):
        for name, (value, bound) in row.items():
            assert abs(float(got[name][i]) - value) <= bound, (name, i, float(got[name][i]), value)


@pytest.mark.parametrize(("loss_type", "beta", "smoothing"), CASES)
def test_metrics_are_the_means_of_the_independent_rewards_and_accuracy(
    loss_type: str, beta: float, smoothing: float
) -> None:
    batch = _random_pair_batch(seed=11)
    sums = pair_statistics(*_ours(batch, beta, loss_type, smoothing))
    metrics = mean_metrics(sums, WORLD_OF_ONE)
    expected = _expected(batch, beta, loss_type, smoothing)
    assert list(metrics) == list(METRICS)

    def mean(key: str) -> tuple[float, float]:
        return (
            sum(r[key][0] for r in expected) / B,
            sum(r[key][1] for r in expected) / B,
        )

    margins = [r["chosen_reward"][0] - r["rejected_reward"][0] for r in expected]
    bounds = [r["chosen_reward"][1] + r["rejected_reward"][1] for r in expected]
    assert all(abs(m) > b for m, b in zip(margins, bounds, strict=True))  # signs are certain
    assert 0 < sum(m > 0 for m in margins) < B  # the batch has both outcomes
    assert metrics["rewards/accuracy"] == sum(m > 0 for m in margins) / B
    assert abs(metrics["rewards/margin"] - sum(margins) / B) <= sum(bounds) / B
    for name, key in (
        ("loss", "loss"),
        ("rewards/chosen", "chosen_reward"),
        ("rewards/rejected", "rejected_reward"),
        ("logps/chosen", "logps_chosen"),
        ("logps/rejected", "logps_rejected"),
    ):
        value, bound = mean(key)
        assert abs(metrics[name] - value) <= bound, name


def test_sequence_logps_sum_only_the_supervised_tokens_and_count_them() -> None:
    batch = _random_pair_batch(seed=3)
    logps, tokens = sequence_logps(batch["policy"], batch["labels"])
    expected = _independent_logps(batch["policy"], batch["labels"])
    assert tokens.tolist() == (batch["labels"] != IGNORE_INDEX).sum(dim=1).tolist()
    for row, (value, bound) in enumerate(expected):
        assert abs(float(logps[row]) - value) <= bound
    # bf16 logits are scored in fp32: the same as scoring their fp32 values
    low = batch["policy"].bfloat16()
    from_bf16 = sequence_logps(low, batch["labels"])[0]
    assert torch.equal(from_bf16, sequence_logps(low.float(), batch["labels"])[0])


def test_gradient_flows_to_the_supervised_positions_only() -> None:
    batch = _random_pair_batch(seed=5)
    logits = batch["policy"].clone().requires_grad_(True)
    sequence_logps(logits, batch["labels"])[0].sum().backward()
    assert logits.grad is not None
    touched = logits.grad.abs().sum(dim=-1) > 0
    assert torch.equal(touched, batch["labels"] != IGNORE_INDEX)


def test_sigmoid_loss_of_equal_log_ratios_is_log_2_and_its_rewards_zero() -> None:
    logps = torch.tensor([-12.5, -3.25, -40.0])
    losses, chosen, rejected = dpo_loss(logps, logps - 1, logps, logps - 1, beta=0.1)
    assert torch.equal(losses, torch.full((3,), math.log(2), dtype=torch.float32))
    assert torch.equal(chosen, torch.zeros(3)) and torch.equal(rejected, torch.zeros(3))


def test_invalid_settings_are_refused() -> None:
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="chosen_tokens"):
        dpo_loss(x, x, x, x, beta=0.1, loss_type="ipo")
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(x, x, x, x, beta=0.1, label_smoothing=0.5)
    with pytest.raises(ValueError, match="unknown"):
        dpo_loss(x, x, x, x, beta=0.1, loss_type="hinge")
