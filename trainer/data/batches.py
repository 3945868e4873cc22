"""Rows through the model: the forward call, the token loss, and each step's normaliser.

Loss of an optimizer step (docs/ARCHITECTURE.md, 'The loss over rows'; issue 11): the sum of
the token cross-entropies over the supervised positions (`labels != -100`) of all
micro-batches of all data-parallel ranks, divided by N, the number of supervised positions of
the whole global batch. Averaging per
micro-batch instead weights a token of a short example more than one of a long example, so
`grad_accum_steps: 4` would not equal 4x the micro-batch (the bug transformers fixed in 4.46,
"Fixing gradient accumulation", by the same global normalisation).

Every rank knows N before its first backward without communication: the sampler's global
batch (the same indices on every rank) is counted by `Rows.num_supervised` (B x T for raw text,
without reading labels). DDP's all-reduce and FSDP's reduce-scatter average gradients over the
`dp_size` data-parallel ranks, so each rank backpropagates its token sum x dp_size / N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

from jobspec.job import TrainSpec
from trainer.data.rows import IGNORE_INDEX, Batch, Rows
from trainer.data.sampler import GlobalBatchSampler


def lm_loss(logits: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy in nats of logits (B, T, V) against targets (B, T), in fp32, over the
    positions whose target is not -100; `reduction` "mean" (per supervised token) or "sum"."""
    return F.cross_entropy(
        logits.float().view(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction=reduction,
    )


def forward(model: nn.Module, batch: Batch, *, plain: bool) -> Tensor:
    """Logits (B, T, vocab) of `batch`. `plain` rows (raw text) take the model's plain causal
    path; others pass `position_ids` and `segment_ids` (attention within each example)."""
    if plain:
        return model(batch.input_ids)
    return model(batch.input_ids, position_ids=batch.position_ids, segment_ids=batch.segment_ids)


@dataclass(frozen=True)
class StepBatches:
    """One optimizer step's data as this rank sees it."""

    micro_batches: list[np.ndarray]  # this rank's `grad_accum_steps` arrays of row indices
    num_supervised: int  # N: supervised positions of the global batch (all ranks), >= 1


def next_step_batches(sampler: GlobalBatchSampler, rows: Rows) -> StepBatches:
    """Advance `sampler` by one step: this rank's micro-batches and the global count N
    (at least 1, so a batch without a supervised position gives loss 0, not NaN)."""
    global_batch = sampler.next_global_batch()
    return StepBatches(
        micro_batches=sampler.split(global_batch),
        num_supervised=max(1, rows.num_supervised(global_batch)),
    )


def resolve_max_steps(
    train: TrainSpec, num_rows: int, global_batch_size: int, steps_per_batch: int = 1
) -> int:
    """Optimizer steps of the run: `train.max_steps`, or for `train.epochs` E the steps that
    take every one of `num_rows` rows at least E times, ceil(E x num_rows / global_batch_size)
    x `steps_per_batch` (GRPO's `num_iterations`: steps that train on one batch; the last step
    may begin the next epoch's shuffle, as the sampler's stream is endless)."""
    if train.max_steps is not None:
        return train.max_steps
    assert train.epochs is not None  # the spec's cross-field check guarantees one of them
    return max(1, math.ceil(train.epochs * num_rows / global_batch_size)) * steps_per_batch
