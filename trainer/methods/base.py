"""What every training method shares: the autocast its forwards run under.

What a method is to the loop is the loop's own protocol, `trainer.loop.Method`: the loop owns
what every method shares (the sampler, clipping, the optimizer and scheduler steps, checkpoints,
the intervals, the end of the run); a method owns what a step's micro-batches compute, the
metrics it adds and what its evaluation reports. Three implement it: next-token prediction
(`trainer.methods.sft.SFT`), DPO (`trainer.methods.dpo_train.DPOMethod`) and GRPO
(`trainer.methods.grpo_train.GRPOMethod`); `trainer.train.build_run` picks one from
`method.kind`, and the loop imports none of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """`torch.autocast` to bf16/fp16 on `device` for `precision` (`train.precision`); nothing
    for fp32. `fp8` autocasts to bf16: its float8 Linears take bf16 in and give bf16 out."""
    if precision == "fp32":
        yield
        return
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16  # fp8: bf16 around
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield
