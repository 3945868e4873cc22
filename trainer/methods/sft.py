"""Next-token prediction (`method.kind: sft`, pre-training too): the summed token
cross-entropy over the supervised positions (`loss_mask`), normalised by the supervised
positions of the whole global batch, and the eval loss in nats per supervised token.

One optimizer step: `grad_accum_steps` micro-batches, forward under autocast, the summed token
loss scaled by dp_size / N (N: supervised positions of the whole global batch,
`trainer.data.batches`), backward under DDP's `no_sync()` (FSDP2: gradient sync off) on all
but the last micro-step (one gradient reduction per step); fp16 scales the loss
(`torch.amp.GradScaler`). A pipeline instead runs its schedule once per micro-step
(`PipelineRunner.step`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from trainer.data.batches import forward, lm_loss, next_step_batches
from trainer.data.prep import unigram_eval_loss
from trainer.distributed import all_reduce_sum, no_sync
from trainer.methods.base import autocast
from trainer.parallel import set_gradient_sync

if TYPE_CHECKING:
    from trainer.data.rows import Rows
    from trainer.loop import Run
    from trainer.parallel.pipeline import PipelineRunner


@dataclass
class SFT:
    """The `Method` of next-token prediction. `vocab_size`: the data's token vocabulary, for
    the unigram baseline."""

    vocab_size: int

    def accumulate(self, run: Run) -> Tensor:
        """Forward/backward of this rank's micro-batches: token sums x dp_size / N; returns
        this rank's token sum / N."""
        spec, device, rows = run.spec, run.dist.device, run.rows[0]
        step = next_step_batches(run.sampler, rows)
        count = step.num_supervised
        loss_sum = torch.zeros((), device=device)
        for m, indices in enumerate(step.micro_batches):
            batch = rows.batch(indices, device)
            last = m == len(step.micro_batches) - 1
            if run.pipeline is not None:
                with autocast(device, spec.train.precision):
                    loss_sum += run.pipeline.step(batch, count, plain=rows.plain).to(device)
                continue
            set_gradient_sync(run.model, last)
            with no_sync(run.parallel_model, skip_sync=not last):
                with autocast(device, spec.train.precision):
                    logits = forward(run.parallel_model, batch, plain=rows.plain)
                    token_sum = lm_loss(logits, batch.labels, reduction="sum")
                # dp ranks' gradients are averaged by DDP/FSDP: x dp_size makes it a sum / N
                loss = token_sum * (run.dims.dp_size / count)
                (run.scaler.scale(loss) if run.scaler else loss).backward()
            loss_sum += token_sum.detach() / count
        return loss_sum

    def train_metrics(self, run: Run) -> dict[str, float]:
        return {}

    def evaluate(self, run: Run) -> dict[str, float]:
        return {"eval_loss": evaluate(run)}

    def baseline_eval_loss(self, run: Run) -> float | None:
        """The eval loss of the train rows' unigram distribution (`trainer.data.prep`)."""
        return unigram_eval_loss(*run.rows, self.vocab_size)


@torch.no_grad()
def evaluate(run: Run, model: nn.Module | None = None) -> float:
    """Mean eval loss (nats per supervised token) over the eval rows of all data-parallel
    ranks (a tensor-parallel group counts its batch once per rank in both sums; the ratio
    holds).

    `model`: evaluate this whole, unsharded copy on each rank instead of the run's model
    (every rank still takes only its own eval batches; single/ddp/fsdp layouts only)."""
    net = run.model if model is None else model
    pipeline = run.pipeline if model is None else None
    net.eval()
    totals = token_loss_sums(
        net,
        run.rows[1],
        run.eval_batches,
        device=run.dist.device,
        precision=run.spec.train.precision,
        pipeline=pipeline,
    )
    net.train()
    loss_sum, count = all_reduce_sum(totals, run.dist).tolist()
    return loss_sum / count


@torch.no_grad()
def token_loss_sums(
    net: nn.Module,
    rows: Rows,
    batches: list[np.ndarray],
    *,
    device: torch.device,
    precision: str,
    pipeline: PipelineRunner | None = None,
) -> Tensor:
    """(2,) float64 on `device`: the summed next-token loss (nats) over the supervised
    positions of `rows`' `batches` (arrays of row indices), and their count; this rank's
    share, before any reduction. The trainer's eval loss and an eval job's perplexity
    (`trainer.evaluate`) are both this sum over that count."""
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    for indices in batches:
        batch = rows.batch(indices, device)
        with autocast(device, precision):
            if pipeline is not None:
                loss_sum, count = pipeline.eval_loss_sum(batch, plain=rows.plain)
                totals[0] += loss_sum
                totals[1] += count
                continue
            logits = forward(net, batch, plain=rows.plain)
        totals[0] += lm_loss(logits, batch.labels, reduction="sum").double()
        totals[1] += rows.num_supervised(indices)
    return totals
