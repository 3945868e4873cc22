"""Pipeline parallelism with `torch.distributed.pipelining` (hand-built `PipelineStage`s).

The blocks are cut into `world_size x stages_per_rank` stages, balanced by block count or at
`pipeline.split_points`; stage s runs on rank s mod world_size (so the first stage is on rank
0 and the last on rank world_size - 1, also for interleaved schedules). The first stage holds
the embeddings, the last the final LayerNorm and the head, where the loss is computed.

Each rank keeps a pruned copy of the `GPT` (its `rank_model`: only its blocks, and only the
embeddings/norm it uses), so parameter names stay those of the full model and checkpoints
reshard by name. With tied embeddings (the default) the token embedding lives on rank 0 (input)
and on the last rank (output); their gradients are summed over those two ranks before each
optimizer step, so both copies stay equal (as Megatron-LM's embedding group does).

Loss and gradient accumulation: the loss of each pipeline micro-batch is its summed token
cross-entropy divided by the supervised-token count of the whole step (`step`'s
`num_supervised`, passed to the loss function through the schedule's `loss_kwargs`), and the
schedules run with `scale_grads=False`, so gradients summed over several `step()` calls are
those of the step's token-mean loss (`trainer.data.batches`).

Packed rows: `position_ids` and `segment_ids` go to every stage as keyword inputs (the
schedules split them into micro-batches like the inputs); the first stage embeds positions,
every stage's blocks attend within segments (`trainer.models.gpt.block_causal_mask`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from jobspec.job import PipelineSpec
from trainer.data.rows import IGNORE_INDEX, Batch
from trainer.models.gpt import GPT, block_causal_mask


def stage_bounds(n_layers: int, num_stages: int, split_points: list[int] | None) -> list[range]:
    """Block indices of each stage: balanced by count (earlier stages take the remainder)
    unless `split_points` (the first block of stages 1, 2, ...) is given."""
    if split_points is None:
        q, r = divmod(n_layers, num_stages)
        sizes = [q + (1 if s < r else 0) for s in range(num_stages)]
        split_points = [sum(sizes[: s + 1]) for s in range(num_stages - 1)]
    edges = [0, *split_points, n_layers]
    return [range(a, b) for a, b in itertools.pairwise(edges)]


class StageModule(nn.Module):
    """One pipeline stage over modules shared with the rank model.

    First stage: token ids (B, T) int64 -> hidden (B, T, d_model); middle: hidden -> hidden;
    last: hidden -> logits (B, T, vocab_size).
    """

    def __init__(self, model: GPT, blocks: range, *, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.tied = model.lm_head is None
        self.wte = model.wte if first or (last and self.tied) else None
        self.wpe = model.wpe if first else None
        self.drop = model.drop
        self.blocks = nn.ModuleDict({str(i): model.blocks[str(i)] for i in blocks})
        self.ln_f = model.ln_f if last else None
        self.lm_head = model.lm_head if last else None

    def forward(
        self,
        x: Tensor,
        position_ids: Tensor | None = None,
        segment_ids: Tensor | None = None,
    ) -> Tensor:
        if self.first:
            assert self.wte is not None and self.wpe is not None
            pos = (
                torch.arange(x.shape[1], device=x.device) if position_ids is None else position_ids
            )
            x = self.drop(self.wte(x) + self.wpe(pos))
        mask = None if segment_ids is None else block_causal_mask(segment_ids)
        for block in self.blocks.values():
            x = block(x, mask)
        if not self.last:
            return x
        assert self.ln_f is not None
        x = self.ln_f(x)
        if self.lm_head is not None:
            return self.lm_head(x)
        assert self.wte is not None
        return F.linear(x, self.wte.weight)


def prune_to_rank(model: GPT, bounds: list[range], rank: int, world_size: int) -> GPT:
    """Drop from `model` (in place) every module no stage of `rank` uses; returns it."""
    mine = {i for s, r in enumerate(bounds) if s % world_size == rank for i in r}
    for key in [k for k in model.blocks if int(k) not in mine]:
        del model.blocks[key]
    first, last = rank == 0, rank == world_size - 1
    if not first:
        model.wpe = None  # type: ignore[assignment]
        if not (last and model.lm_head is None):
            model.wte = None  # type: ignore[assignment]
    if not last:
        model.ln_f = None  # type: ignore[assignment]
        model.lm_head = None
    return model


class PipelineRunner:
    """The stages of this rank and the schedule that drives them; see the module doc."""

    def __init__(
        self,
        rank_model: GPT,
        bounds: list[range],
        spec: PipelineSpec,
        *,
        loss: Callable[[Tensor, Tensor], Tensor],
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> None:
        self.rank_model = rank_model
        self.rank, self.world_size = rank, world_size
        self.num_microbatches = spec.num_microbatches
        n = len(bounds)
        self.stages = [
            PipelineStage(
                StageModule(rank_model, bounds[s], first=s == 0, last=s == n - 1),
                stage_index=s,
                num_stages=n,
                device=device,
            )
            for s in range(rank, n, world_size)
        ]
        self.has_last = any(stage.is_last for stage in self.stages)

        def loss_fn(logits: Tensor, targets: Tensor, num_supervised: float = 1.0) -> Tensor:
            return loss(logits, targets) / num_supervised

        if spec.schedule == "interleaved_1f1b":
            self.schedule: ScheduleGPipe | Schedule1F1B | ScheduleInterleaved1F1B = (
                ScheduleInterleaved1F1B(
                    # torch annotates a list (invariant) of the private stage base class
                    self.stages,  # type: ignore[arg-type]
                    spec.num_microbatches,
                    loss_fn=loss_fn,
                    scale_grads=False,
                )
            )
        else:
            single = ScheduleGPipe if spec.schedule == "gpipe" else Schedule1F1B
            self.schedule = single(
                self.stages[0], spec.num_microbatches, loss_fn=loss_fn, scale_grads=False
            )
        tied = rank_model.lm_head is None and world_size > 1
        # Every rank takes part in new_group; only the two embedding holders use it.
        self._tied_group = dist.new_group([0, world_size - 1]) if tied else None
        self._holds_tied = tied and rank in (0, world_size - 1)

    def step(self, batch: Batch, num_supervised: int, *, plain: bool) -> Tensor:
        """Forward and backward of one batch (B, T) through all stages; `num_supervised`:
        the supervised positions of the step's whole global batch.

        Returns the batch's summed token loss / `num_supervised` on the last stage's rank
        (the step's token-mean loss after summing over accumulation steps), 0 elsewhere.
        """
        losses: list[Tensor] = []
        self.schedule.step(
            batch.input_ids,
            target=batch.labels,
            losses=losses,
            loss_kwargs={"num_supervised": float(num_supervised)},
            **_packing_kwargs(batch, plain),  # type: ignore[arg-type]  # forwarded to the stage modules; step() also has a bool parameter mypy matches it against
        )
        return torch.stack(losses).sum().detach() if self.has_last else torch.zeros(())

    def eval_loss_sum(self, batch: Batch, *, plain: bool) -> tuple[float, int]:
        """(summed token losses in nats, supervised positions) of one batch, forward only;
        (0, 0) on ranks without the last stage."""
        losses: list[Tensor] = []
        self.schedule.eval(
            batch.input_ids, target=batch.labels, losses=losses, **_packing_kwargs(batch, plain)
        )
        if not self.has_last:
            return 0.0, 0
        count = int((batch.labels != IGNORE_INDEX).sum())
        return float(torch.stack(losses).double().sum()), count

    def sync_tied_grads(self) -> None:
        """Sum the tied embedding's gradient over its two copies (ranks 0 and world - 1)."""
        if not self._holds_tied:
            return
        weight = self.rank_model.wte.weight
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        dist.all_reduce(weight.grad, group=self._tied_group)

    def norm_params(self) -> list[nn.Parameter]:
        """This rank's parameters counted in the global gradient norm: the tied embedding's
        second copy (on the last rank) is left out, so it is counted once."""
        skip = set()
        if self._holds_tied and self.rank != 0:
            skip.add(id(self.rank_model.wte.weight))
        return [p for p in self.rank_model.parameters() if id(p) not in skip]


def _packing_kwargs(batch: Batch, plain: bool) -> dict[str, Tensor]:
    """The stages' keyword inputs: none for plain rows, else position and segment ids."""
    if plain:
        return {}
    return {"position_ids": batch.position_ids, "segment_ids": batch.segment_ids}
