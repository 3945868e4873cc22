"""Which chunks each rank trains on at each step, independent of how the batch is split.

The training chunks are read as one endless stream: epoch `e` is a permutation of all chunk
indices seeded by `(seed, e)`, and the stream is epoch 0, then epoch 1, and so on. Optimizer
step `s` consumes the next `global_batch_size` indices of the stream; rank `r` takes the
`r`-th contiguous slice of `grad_accum_steps x micro_batch_size` of them, micro-step `m` the
`m`-th `micro_batch_size` of that. So the set of sequences in a step depends only on the seed,
the step and `global_batch_size` — not on world_size x grad_accum_steps x micro_batch_size —
which is what lets single-process, DDP and the other layouts be compared step by step.

The position (`epoch`, `offset` into its permutation) is the sampler's whole state; it goes
into checkpoints, so a resumed run continues the stream where the saved one left it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class GlobalBatchSampler:
    """Chunk indices per (step, rank, micro-step); a `Stateful` for DCP."""

    def __init__(
        self,
        *,
        num_chunks: int,
        seed: int,
        micro_batch_size: int,
        grad_accum_steps: int,
        rank: int,
        world_size: int,
    ) -> None:
        if num_chunks < 1:
            raise ValueError("the sampler needs at least one chunk")
        self.num_chunks = num_chunks
        self.seed = seed
        self.micro_batch_size = micro_batch_size
        self.grad_accum_steps = grad_accum_steps
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.offset = 0
        self._perm_epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step over all ranks."""
        return self.micro_batch_size * self.grad_accum_steps * self.world_size

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of all chunk indices in `epoch`: (num_chunks,) int64."""
        if epoch != self._perm_epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm = rng.permutation(self.num_chunks).astype(np.int64)
            self._perm_epoch = epoch
        return self._perm

    def next_global_batch(self) -> np.ndarray:
        """The next `global_batch_size` indices of the stream, (G,) int64; advances."""
        parts: list[np.ndarray] = []
        need = self.global_batch_size
        while need:
            take = min(need, self.num_chunks - self.offset)
            parts.append(self.permutation(self.epoch)[self.offset : self.offset + take])
            need -= take
            self.offset += take
            if self.offset == self.num_chunks:
                self.epoch, self.offset = self.epoch + 1, 0
        return np.concatenate(parts)

    def split(self, batch: np.ndarray) -> list[np.ndarray]:
        """This rank's micro-batches of a global batch (G,): `grad_accum_steps` arrays (M,)."""
        per_rank = self.micro_batch_size * self.grad_accum_steps
        mine = batch[self.rank * per_rank : (self.rank + 1) * per_rank]
        return np.split(mine, self.grad_accum_steps)

    def next_step(self) -> list[np.ndarray]:
        """This rank's micro-batches of the next step: `grad_accum_steps` arrays (M,) int64."""
        return self.split(self.next_global_batch())

    @property
    def epochs_done(self) -> float:
        """Passes over the data so far: completed epochs + the share of the current one."""
        return self.epoch + self.offset / self.num_chunks

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])


def eval_batches(
    *,
    num_chunks: int,
    num_batches: int,
    micro_batch_size: int,
    rank: int,
    world_size: int,
    full_batches_only: bool = False,
) -> list[np.ndarray]:
    """This rank's evaluation micro-batches: arrays of at most `micro_batch_size` indices.

    Every evaluation scores the same chunks, the first `num_batches x micro_batch_size x
    world_size` of the eval split (all of them if there are fewer), dealt round-robin to the
    ranks; a rank may get fewer or none. The loss summed over ranks and divided by the
    token count is therefore the same for any world size with the same global eval batch.
    `full_batches_only` (sharded and pipelined models, whose forwards are collective) drops
    the tail that would not give every rank a full batch.
    """
    total = min(num_chunks, num_batches * micro_batch_size * world_size)
    if full_batches_only:  # every rank gets the same number of full batches
        total -= total % (micro_batch_size * world_size)
    mine = np.arange(rank, total, world_size, dtype=np.int64)
    return [mine[i : i + micro_batch_size] for i in range(0, len(mine), micro_batch_size)]
