"""`ComputeTimer`'s DDP communication hook reduces gradients bit-identically to DDP's own
reduction: 3 real processes over gloo (a world size that is not a power of two, where
dividing by it and multiplying by its inverse differ in the last bit)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from trainer.parallel.compute_timer import ComputeTimer

WORLD_SIZE = 3


def _gradients(rank: int, hook: str) -> tuple[torch.Tensor, float | None]:
    """Three steps' gradients of a small MLP under DDP (several buckets) reduced by `hook`
    (`none`: DDP's own, `timer`: the timer's, `torch`: torch's `allreduce_hook`); and the
    timer's seconds since the last step's start."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Tanh(), torch.nn.Linear(300, 50))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
    timer = ComputeTimer()
    if hook == "timer":
        ddp.register_comm_hook(timer, ComputeTimer.allreduce_hook)
    elif hook == "torch":
        ddp.register_comm_hook(None, allreduce_hook)
    grads, started = [], 0.0
    for step in range(3):
        torch.manual_seed(100 + rank + 10 * step)
        started = time.perf_counter()
        ddp(torch.randn(37, 64)).pow(2).sum().mul(1.7).backward()
        grads.append(
            torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        )
        model.zero_grad(set_to_none=True)
    return torch.cat(grads).clone(), timer.since(started)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE
    )
    out = {hook: _gradients(rank, hook) for hook in ("none", "timer", "torch")}
    torch.save(out, f"{out_dir}/{rank}.pt")
    dist.destroy_process_group()


def test_the_hook_reduces_gradients_bit_identically_to_ddp_and_times_the_backward(
    tmp_path: Path,
) -> None:
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD_SIZE)
    results = [torch.load(tmp_path / f"{r}.pt") for r in range(WORLD_SIZE)]
    for r in results:
        (default, _), (timed, seconds), (divided, _) = r["none"], r["timer"], r["torch"]
        assert torch.equal(timed, default)
        assert torch.equal(timed, results[0]["timer"][0])  # the same on every rank
        assert seconds is not None and seconds > 0
        # the comparison can fail: torch's hook divides by 3, and some bits differ
        assert not torch.equal(divided, default)
        assert torch.allclose(divided, default, rtol=1e-5, atol=1e-6)
