"""A rank's own compute time per step under synchronous DDP, for straggler detection.

Under DDP every rank waits for the slowest inside backward (the gradient all-reduce), so wall
step times are equal on all ranks and a slow rank does not show in them. `ComputeTimer` is a
DDP communication hook (`DistributedDataParallel.register_comm_hook`) that does the default
reduction and notes, with `time.perf_counter()`, when each gradient bucket became ready on
this rank: the last bucket's ready time minus the step's start is the rank's compute time
(data, forward and backward up to its last gradient), without the wait for the others. Under
gradient accumulation only the last micro-batch syncs (`no_sync` before it), so that is from
the step's start to the last bucket of the last micro-batch.

The hook's reduction is the one DDP does without a hook and with `gradient_as_bucket_view`
off, as `trainer.parallel.parallelize` builds it (`Reducer::mark_variable_ready_dense` scales
each gradient by `1.0 / world_size` on its way into the bucket, then an all-reduce sums the
bucket): the bucket is scaled by the same float, then all-reduced, so gradients are
bit-identical to a run without the hook (checked with 3 ranks). torch's own `allreduce_hook`
divides by the world size instead, which differs in the last bit for a world size that is
not a power of two; so does the reducer itself with `gradient_as_bucket_view` on.

CPU only: on CUDA the hook runs when the kernels are queued, not when they are done, so
`trainer.parallel.parallelize` registers it for CPU runs; CUDA DDP runs, and FSDP, tensor and
pipeline parallel runs (no DDP reducer), keep reporting wall step time.

This module must not use `from __future__ import annotations`: DDP checks the hook's
annotations against the classes themselves (`DistributedDataParallel._check_comm_hook`).
"""

import time

import torch
import torch.distributed as dist
from torch import Tensor


class ComputeTimer:
    """The state of the communication hook `allreduce_hook`: when this rank's last gradient
    bucket became ready (`time.perf_counter()` seconds; None before the first)."""

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        """`process_group`: the group DDP reduces over (None: the default group)."""
        self.process_group = process_group
        self.last_ready: float | None = None

    def since(self, started: float) -> float | None:
        """Seconds from `started` (a `time.perf_counter()` value) to the last bucket ready
        after it; None when no bucket became ready since (no synchronised backward)."""
        if self.last_ready is None or self.last_ready < started:
            return None
        return self.last_ready - started

    @staticmethod
    def allreduce_hook(
        state: "ComputeTimer", bucket: dist.GradBucket
    ) -> torch.futures.Future[Tensor]:
        """The hook (`state`: the timer): note the bucket's ready time, scale it by
        1 / world_size, all-reduce (sum) it asynchronously; the future holds the reduced
        bucket."""
        state.last_ready = time.perf_counter()
        group = state.process_group if state.process_group is not None else dist.group.WORLD
        buffer = bucket.buffer()
        buffer.mul_(1.0 / dist.get_world_size(group))
        work = dist.all_reduce(buffer, group=group, async_op=True)
        assert work is not None  # async_op=True returns the work
        return work.get_future().then(lambda fut: fut.value()[0])
