"""What a training method is to the loop (`trainer.loop`): the `Method` protocol, and the
autocast every method's forwards run under.

The loop owns what every method shares: the sampler, gradient clipping, the optimizer and
scheduler steps, the fp16 scaler's step, the step-boundary agreement on loss and stop,
checkpoints, the log and eval intervals, the end of the run. A method owns what a step's
micro-batches compute (its loss and backward), the metrics it adds at log steps, and what its
evaluation reports. Two implement it: next-token prediction (`trainer.methods.sft.SFT`, for
pre-training and supervised fine-tuning alike) and DPO (`trainer.methods.dpo_train.DPOMethod`).
`trainer.train.build_run` picks one from `method.kind`; the loop has no branch on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:
    from trainer.loop import Run


class Method(Protocol):
    """One training method's part of the loop. Every call but `baseline_eval_loss` is made by
    every rank at the same steps (each may hold collectives)."""

    def accumulate(self, run: Run) -> Tensor:
        """Forward and backward over this rank's micro-batches of the next optimizer step
        (`run.sampler`), gradients reduced on the last micro-batch only. Returns this rank's
        share of the step's mean loss (0-dim fp32, detached): the ranks' shares x
        `run.loss_share` add up to the mean over the global batch."""
        ...

    def train_metrics(self, run: Run) -> dict[str, float]:
        """Metrics of the step just taken, added to the loop's `loss`, `lr`, ... at log steps."""
        ...

    def evaluate(self, run: Run) -> dict[str, float]:
        """Held-out metrics over every rank's eval batches (`run.eval_batches`); holds
        `eval_loss`, the number the loop checks for finiteness and reports as the run's."""
        ...

    def baseline_eval_loss(self, run: Run) -> float | None:
        """A model-free reference for `eval_loss` (the `running` status's
        `unigram_eval_loss`), or None where the method has none. Called on every rank, no
        collective."""
        ...


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """`torch.autocast` to bf16/fp16 on `device` for `precision` (`train.precision`); nothing
    for fp32."""
    if precision == "fp32":
        yield
        return
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield
