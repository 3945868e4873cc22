"""AdamW, its learning-rate schedule and gradient clipping.

AdamW: Loshchilov & Hutter 2019 (`torch.optim.AdamW`). Weight decay applies to the matrices
of linear layers only; biases, LayerNorm parameters and embeddings are not decayed (as in
GPT-2/nanoGPT). Schedule: linear warmup, then cosine (Loshchilov & Hutter 2017) or linear
decay to `min_lr_ratio x lr`, or constant, as a `LambdaLR`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from jobspec.job import OptimSpec


def build_optimizer(
    model: nn.Module, spec: OptimSpec, *, foreach: bool | None = None, fused: bool = False
) -> torch.optim.AdamW:
    """AdamW over `model`'s trainable parameters, in a decayed and a non-decayed group.

    `fused=True`: torch's fused CUDA kernel (every parameter on the GPU; the same update
    within rounding). `foreach=False` under tensor parallelism: a group mixes DTensors of
    several meshes and plain tensors, which the multi-tensor kernels cannot take in one call.
    An empty group (LoRA: only adapter matrices train) is left out: DCP cannot key a group
    by no parameter.
    """
    embedding_params = {
        id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    }
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        is_matrix = p.dim() >= 2 and id(p) not in embedding_params
        (decay if is_matrix else no_decay).append(p)
    groups = [
        {"params": params, "weight_decay": wd}
        for params, wd in ((decay, spec.weight_decay), (no_decay, 0.0))
        if params
    ]
    betas = (spec.beta1, spec.beta2)
    if fused:
        return torch.optim.AdamW(groups, lr=spec.lr, betas=betas, fused=True)
    return torch.optim.AdamW(groups, lr=spec.lr, betas=betas, foreach=foreach)


def lr_factor(
    step: int, *, warmup_steps: int, max_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Multiplier of the peak lr for the optimizer step with 0-based index `step`.

    Warmup: (step + 1) / warmup_steps for step < warmup_steps (the first step is not lr 0).
    Then, with progress p = (step - warmup_steps) / (max_steps - warmup_steps) in [0, 1]:
    cosine min + (1 - min)(1 + cos(pi p)) / 2, linear min + (1 - min)(1 - p), constant 1.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    if schedule == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - progress)
    raise ValueError(f"unknown schedule {schedule!r}")


def build_scheduler(optimizer: torch.optim.Optimizer, spec: OptimSpec, max_steps: int) -> LambdaLR:
    """`LambdaLR` applying `lr_factor`; call `.step()` once after each optimizer step."""
    factor = functools.partial(
        lr_factor,
        warmup_steps=spec.warmup_steps,
        max_steps=max_steps,
        schedule=spec.schedule,
        min_lr_ratio=spec.min_lr_ratio,
    )
    return LambdaLR(optimizer, factor)


def clip_gradients(params: Iterable[nn.Parameter], max_norm: float | None) -> Tensor:
    """Total L2 norm of the gradients (0-dim tensor), clipped to `max_norm` unless None.

    `torch.nn.utils.clip_grad_norm_` / `get_total_norm`; the norm is measured before clipping.
    """
    params = [p for p in params if p.grad is not None]
    if max_norm is None:
        return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    return torch.nn.utils.clip_grad_norm_(params, max_norm)
