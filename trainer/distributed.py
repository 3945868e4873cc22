"""Process group, data parallelism and teardown, from torchrun's environment.

Under torchrun (`WORLD_SIZE`, `RANK`, `LOCAL_RANK` set) with more than one process, the
default group is gloo on CPU, or NCCL for CUDA tensors plus gloo for CPU ones (DCP's async
save needs a CPU backend). Without torchrun, or with one process, there is no process group
at all and every collective here is a no-op, so `python -m trainer` runs stand-alone.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_distributed(self) -> bool:
        """True when a process group exists (world_size > 1)."""
        return self.world_size > 1


def env_rank() -> int:
    """This process's global rank from torchrun's `RANK` (0 when stand-alone)."""
    return int(os.environ.get("RANK", "0"))


def env_world_size() -> int:
    """The number of processes from torchrun's `WORLD_SIZE` (1 when stand-alone)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(device_kind: str) -> DistInfo:
    """Pick this rank's device and, for world_size > 1, join the default process group.

    `device_kind` is `cpu` or `cuda`. Raises `RuntimeError` when CUDA is asked for but absent.
    """
    world_size, rank = env_world_size(), env_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("resources.device is 'cuda' but no CUDA device is available")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1:
        if device.type == "cuda":
            dist.init_process_group(backend="cpu:gloo,cuda:nccl", device_id=device)
        else:
            dist.init_process_group(backend="gloo")
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def no_sync(model: nn.Module, skip_sync: bool) -> contextlib.AbstractContextManager[Any]:
    """DDP's `no_sync()` when `skip_sync` and `model` is DDP: gradients accumulate locally."""
    if skip_sync and isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def all_reduce_sum(tensor: Tensor, info: DistInfo) -> Tensor:
    """Sum `tensor` over all ranks, in place; returns it (unchanged when not distributed)."""
    if info.is_distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_floats(values: Sequence[float], info: DistInfo) -> list[list[float]]:
    """Every rank's `values` (the same length on all ranks), in rank order: one all-gather of
    a float64 tensor over the default process group; `[list(values)]` when not distributed."""
    if not info.is_distributed:
        return [list(values)]
    mine = torch.tensor(list(values), dtype=torch.float64, device=info.device)
    gathered = [torch.empty_like(mine) for _ in range(info.world_size)]
    dist.all_gather(gathered, mine)
    return [t.tolist() for t in gathered]


def broadcast_from_rank0(obj: Any, info: DistInfo) -> Any:
    """Rank 0's `obj` on every rank (a picklable object)."""
    if not info.is_distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown(info: DistInfo | None, *, clean: bool) -> None:
    """Leave the process group.

    Callers drop their references to models, optimizers and outputs first; then
    `gc.collect()` frees gloo work objects while the group still exists (freeing them at
    interpreter exit aborts the process: docs/ARCHITECTURE.md, 'Torch traps'), `barrier()`
    (only when `clean`: after a failure the other ranks may never arrive) and
    `destroy_process_group()`.
    """
    gc.collect()
    if info is None or not dist.is_initialized():
        return
    if clean:
        dist.barrier()
    dist.destroy_process_group()
