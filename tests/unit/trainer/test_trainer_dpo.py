"""DPO training in process (world of one, tiny models): the reference model, the step's
normalisation by pairs, and the loss at the start of training.

Data: stdlib preference pairs (tests/support/dpo.py) as byte-level rows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from dataformat.errors import InvalidJobError
from jobspec.job import JobSpec
from tests.support.dpo import stdlib_pairs, write_preference_rows
from tests.support.training import FINE_TUNE, TINY_LLAMA, cpu_world_of_one, tiny_spec
from trainer.data.rows import Batch, Rows
from trainer.methods.dpo_train import (
    DPOMethod,
    build_dpo,
    check_pairs,
    concat_pairs,
    logits_of,
    pair_batches,
)
from trainer.models.network import Network, build_network
from trainer.optim import build_optimizer

CPU = torch.device("cpu")
SEQ_LEN = 96
LOG_2_FP32 = float(torch.tensor(math.log(2), dtype=torch.float32))


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> tuple[Rows, Rows]:
    directory = tmp_path_factory.mktemp("pairs")
    return write_preference_rows(directory, stdlib_pairs(16, SEQ_LEN + 1), SEQ_LEN)


def _spec(model: str = "gpt", lora: bool = False, precision: str = "fp32", **dpo: Any) -> JobSpec:
    sections: dict[str, Any] = {
        "model": {"seq_len": SEQ_LEN},
        "train": {"precision": precision},
        "method": {"kind": "dpo", "dpo": dpo},
        "optim": {"lr": 1e-2, "warmup_steps": 0, "weight_decay": 0.0},
    }
    if model == "llama":
        sections["model"] |= {"kind": "hf", "hf": {"from_config": TINY_LLAMA}}
    if lora:
        sections["lora"] = {"r": 4}
        sections["model"] |= FINE_TUNE
    return tiny_spec(Path("/unused"), **sections)


def _build(spec: JobSpec) -> tuple[Network, DPOMethod]:
    network = build_network(spec, device=CPU)
    method = build_dpo(spec, network, network.model, dist_info=cpu_world_of_one(), mesh=None)
    assert method is not None and method.precision == spec.train.precision
    return network, method


def _pairs(rows: tuple[Rows, Rows], indices: list[int]) -> tuple[Batch, Batch]:
    return rows[0].batch(np.array(indices), CPU), rows[1].batch(np.array(indices), CPU)


def _step(network: Network, method: DPOMethod, pairs: list[tuple[Batch, Batch]]) -> float:
    """One optimizer step (AdamW, lr 1e-2) over `pairs`; the step's mean loss."""
    optimizer = build_optimizer(network.model, _spec().optim)
    n = sum(len(c.input_ids) for c, _ in pairs)
    loss = method.accumulate_pairs(
        pairs, model=network.model, train_model=network.model, global_pairs=n, dp_size=1
    )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss)


@pytest.mark.parametrize(
    ("model", "lora", "precision"),
    [
        ("gpt", False, "fp32"),
        ("gpt", False, "bf16"),
        ("gpt", True, "fp32"),
        ("llama", True, "fp32"),
    ],
)
def test_at_init_the_policy_is_its_reference_the_loss_log_2_and_the_rewards_zero(
    model: str, lora: bool, precision: str, rows: tuple[Rows, Rows]
) -> None:
    network, method = _build(_spec(model, lora, precision))
    loss = method.accumulate_pairs(
        [_pairs(rows, [0, 1, 2, 3])],
        model=network.model,
        train_model=network.model,
        global_pairs=4,
        dp_size=1,
    )
    metrics = method.step_metrics(cpu_world_of_one())
    assert float(loss) == LOG_2_FP32 and metrics["loss"] == LOG_2_FP32
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy"):
        assert metrics[name] == 0.0, name
    assert metrics["logps/chosen"] < 0 and metrics["logps/rejected"] < 0


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_lora_reference_is_the_adapter_free_model_and_stays_it_while_the_policy_moves(
    model: str, rows: tuple[Rows, Rows]
) -> None:
    network, method = _build(_spec(model, lora=True))
    reference = method.reference
    assert reference is not None and reference.model is network.model  # no second copy
    base = build_network(_spec(model, lora=False), device=CPU).model  # same seed, no adapters
    both = concat_pairs(*_pairs(rows, [4, 5, 6, 7]))

    def logps(net: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            from trainer.methods.dpo import sequence_logps

            return sequence_logps(logits_of(net, both), both.labels)[0]

    ref_logps = reference.logps(both, forward=logits_of, precision="fp32")
    assert torch.equal(ref_logps, logps(base))
    _step(network, method, [_pairs(rows, [0, 1, 2, 3])])
    moved = (logps(network.model) - ref_logps).abs()
    assert float(moved.min()) > 1e-3  # adapters trained: every answer's log-prob changed
    assert torch.equal(reference.logps(both, forward=logits_of, precision="fp32"), ref_logps)
    assert network.model.training  # the reference forward restored the training mode


def test_sft_jobs_get_no_dpo_method() -> None:
    spec = tiny_spec(Path("/unused"))
    network = build_network(spec, device=CPU)
    assert build_dpo(spec, network, network.model, dist_info=cpu_world_of_one(), mesh=None) is None


def test_full_reference_is_a_frozen_copy_of_the_starting_weights(rows: tuple[Rows, Rows]) -> None:
    network, method = _build(_spec())
    reference = method.reference
    assert reference is not None and reference.peft_model is None
    frozen = reference.model
    assert frozen is not network.model and not frozen.training
    assert not any(p.requires_grad for p in frozen.parameters())
    start = {k: v.clone() for k, v in frozen.state_dict().items()}
    assert all(torch.equal(start[k], v) for k, v in network.model.state_dict().items())
    _step(network, method, [_pairs(rows, [0, 1, 2, 3])])
    assert all(torch.equal(start[k], v) for k, v in frozen.state_dict().items())
    assert any(not torch.equal(start[k], v) for k, v in network.model.state_dict().items())


def test_accumulated_micro_batches_give_the_gradient_of_the_mean_over_pairs(
    rows: tuple[Rows, Rows],
) -> None:
    """One micro-batch of 6 pairs vs 3 micro-batches of 2 (after a step, so the loss is not
    flat): the same gradient, to fp32 summation-order tolerance (1e-5 relative of the norm)."""
    grads = []
    for split in ([[0, 1, 2, 3, 4, 5]], [[0, 1], [2, 3], [4, 5]]):
        network, method = _build(_spec())
        _step(network, method, [_pairs(rows, [8, 9, 10, 11])])
        pairs = [_pairs(rows, ids) for ids in split]
        method.accumulate_pairs(
            pairs, model=network.model, train_model=network.model, global_pairs=6, dp_size=1
        )
        grads.append(torch.cat([p.grad.flatten() for p in network.model.parameters()]))
    assert float(grads[0].norm()) > 0
    assert float((grads[0] - grads[1]).norm()) <= 1e-5 * float(grads[0].norm())


def test_reference_free_dpo_scores_the_policy_alone(rows: tuple[Rows, Rows]) -> None:
    network, method = _build(_spec(reference="none"))
    assert method.reference is None
    method.accumulate_pairs(
        [_pairs(rows, [0, 1])],
        model=network.model,
        train_model=network.model,
        global_pairs=2,
        dp_size=1,
    )
    metrics = method.step_metrics(cpu_world_of_one())
    assert metrics["rewards/chosen"] == pytest.approx(0.1 * metrics["logps/chosen"], rel=1e-6)


def test_evaluation_reports_eval_metrics_and_leaves_the_model_training(
    rows: tuple[Rows, Rows],
) -> None:
    network, method = _build(_spec(loss_type="ipo"))
    batches = [np.array([0, 1]), np.array([2, 3])]
    metrics = method.evaluate_pairs(
        network.model, pair_batches(*rows, batches, CPU), cpu_world_of_one()
    )
    assert metrics["eval_loss"] == pytest.approx((1 / (2 * 0.1)) ** 2)  # IPO at h' = 0
    assert metrics["eval_rewards/accuracy"] == 0.0 and network.model.training


def test_pairs_without_an_answer_token_or_of_unequal_counts_are_refused(
    rows: tuple[Rows, Rows],
) -> None:
    chosen, rejected = rows
    check_pairs(chosen, rejected)
    labels = np.array(rejected.labels)
    labels[3] = -100
    with pytest.raises(InvalidJobError, match="pair 3: its rejected answer"):
        check_pairs(chosen, Rows(rejected.input_ids, labels, rejected.position_ids,
                                 rejected.segment_ids))  # fmt: skip
    short = Rows(*(getattr(rejected, n)[:5] for n in ("input_ids", "labels", "position_ids",
                                                       "segment_ids")))  # fmt: skip
    with pytest.raises(InvalidJobError, match="differ"):
        check_pairs(chosen, short)
