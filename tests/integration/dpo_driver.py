"""A DPO run for the tests, launched by `torchrun -m tests.integration.dpo_driver` (or plain
`python -m` for one process): the trainer's own components (build_network, parallelize,
build_optimizer, GlobalBatchSampler, build_dpo, clip_grad_norm) over the
preference rows in ROWS/chosen and ROWS/rejected, for `train.max_steps` steps.

Rank 0 writes OUT (JSON): the eval metrics over all pairs before and after training, and
the train metrics of every step. This stands in for `python -m trainer` until the loop reads
preference rows (the lead's integration); it is test code, not a second trainer.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from jobspec.job import JobSpec
from trainer.data.rows import Rows
from trainer.data.sampler import GlobalBatchSampler, eval_batches
from trainer.distributed import DistInfo, all_reduce_sum, init_distributed, shutdown
from trainer.methods.dpo_train import build_dpo, check_pairs, pair_batches
from trainer.models.network import build_network
from trainer.optim import build_optimizer
from trainer.parallel import ParallelDims, clip_grad_norm, parallelize


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True)
    p.add_argument("--rows", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args()
    info = init_distributed("cpu")
    record = train(JobSpec.load(args.spec), info, args.rows)  # frees the models on return
    if info.rank == 0:
        args.out.write_text(json.dumps(record, indent=2))
    gc.collect()
    shutdown(info, clean=True)


def train(spec: JobSpec, info: DistInfo, rows: Path) -> dict[str, Any]:
    """Eval metrics before and after `train.max_steps` DPO steps, and each step's metrics."""
    torch.manual_seed(spec.seed + info.rank)
    dims = ParallelDims.from_spec(spec, info.world_size)
    network = build_network(spec, device=info.device, dist_info=info)
    # `loss` is a pipeline's last-stage loss: unused (DPO refuses pipelines)
    parts = parallelize(
        network.model, dims, spec, rank=info.rank, device=info.device, loss=F.cross_entropy
    )
    optimizer = build_optimizer(parts.model, spec.optim)
    method = build_dpo(spec, network, parts.model, dist_info=info, mesh=parts.mesh)
    assert method is not None
    chosen, rejected = Rows.open(rows / "chosen"), Rows.open(rows / "rejected")
    check_pairs(chosen, rejected)
    dp_rank = dims.dp_rank(info.rank)
    sampler = GlobalBatchSampler(
        num_chunks=len(chosen),
        seed=spec.seed,
        micro_batch_size=spec.train.micro_batch_size,
        grad_accum_steps=spec.train.grad_accum_steps,
        rank=dp_rank,
        world_size=dims.dp_size,
    )
    held = eval_batches(
        num_chunks=len(chosen),
        num_batches=len(chosen),
        micro_batch_size=spec.train.micro_batch_size,
        rank=dp_rank,
        world_size=dims.dp_size,
        full_batches_only=True,
    )

    def evaluate() -> dict[str, float]:
        return method.evaluate_pairs(
            parts.model, pair_batches(chosen, rejected, held, info.device), info
        )

    record: dict[str, Any] = {"eval_start": evaluate()}
    train = []
    for _ in range(spec.train.max_steps):
        pairs = list(pair_batches(chosen, rejected, sampler.next_step(), info.device))
        share = method.accumulate_pairs(
            pairs,
            model=parts.model,
            train_model=parts.train_model,
            global_pairs=sampler.global_batch_size,
            dp_size=dims.dp_size,
        )
        clip_grad_norm(list(parts.model.parameters()), spec.optim.grad_clip, pipeline=None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # the ranks' shares add up to the step's mean loss (as the loop's `agree` sums them)
        step_loss = float(all_reduce_sum(share.reshape(1), info))
        train.append({**method.step_metrics(info), "shares_sum": step_loss})
    record["train"] = train
    record["eval_end"] = evaluate()
    return record


if __name__ == "__main__":
    main()
