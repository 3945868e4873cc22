"""`parallelize(model, dims, spec)`: apply the job's strategy with torch's own implementations.

Order (torchtitan): tensor parallel -> activation checkpointing -> compile -> FSDP (or DDP);
a pipeline prunes the model to this rank's stages first. The optimizer is built afterwards,
over the parameters this returns (DTensors under TP/FSDP).

- `fsdp`: `fully_shard` on each block, then on the root, with a `MixedPrecisionPolicy`
  and optional `CPUOffloadPolicy`; HSDP when the mesh has a replicate axis. A block is one
  of the built-in GPT's `blocks`, or of a Hugging Face model a module whose class is in its
  `_no_split_modules` (`block_slots`); LoRA adapters, applied before, shard with their block.
- `tensor`: `parallelize_module` with `ColwiseParallel` on q/k/v and the MLP's first linear,
  `RowwiseParallel` on the attention output and the MLP's second (Shoeybi et al. 2019,
  Megatron-LM); the embeddings, LayerNorms and head stay replicated.
- 2-D: TP on `mesh["tp"]`, then `fully_shard` over `mesh["dp"]`.
- `pipeline`: see `trainer.parallel.pipeline`.
- DDP on CPU reduces through `trainer.parallel.compute_timer`'s communication hook, which
  times each rank's own compute for straggler detection (same gradients as DDP's default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from jobspec.job import FSDPSpec, JobSpec
from trainer.models.gpt import GPT
from trainer.models.network import is_bnb_4bit
from trainer.parallel.compute_timer import ComputeTimer
from trainer.parallel.dims import ParallelDims
from trainer.parallel.pipeline import PipelineRunner, prune_to_rank, stage_bounds

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TP_PLAN: dict[str, type[ColwiseParallel] | type[RowwiseParallel]] = {
    "attn.wq": ColwiseParallel,
    "attn.wk": ColwiseParallel,
    "attn.wv": ColwiseParallel,
    "attn.wo": RowwiseParallel,
    "mlp.fc": ColwiseParallel,
    "mlp.proj": RowwiseParallel,
}


@dataclass
class Parallelized:
    """What the rest of the trainer works with after `parallelize`."""

    model: nn.Module  # GPT or HFCausalLM: parameters, eval, sampling, checkpoints (sharded
    # or pruned under fsdp/tp/pp)
    train_model: nn.Module  # what a training forward calls: DDP(model) or model
    mesh: DeviceMesh | None
    pipeline: PipelineRunner | None  # pipeline only: drives forward/backward
    # DDP on CPU only: when this rank's last gradient bucket of a step was ready
    compute_timer: ComputeTimer | None = None


def parallelize(
    model: nn.Module,
    dims: ParallelDims,
    spec: JobSpec,
    *,
    rank: int,
    device: torch.device,
    loss: Callable[[Tensor, Tensor], Tensor],
) -> Parallelized:
    """Apply `spec.parallelism` to `model` (built and initialized on `device`), in place.

    `loss` (logits, targets) -> summed token loss is the pipeline's last-stage loss (divided
    there by each step's supervised-token count).
    """
    mesh = dims.build_mesh(device.type)
    if dims.pp > 1:
        assert isinstance(model, GPT)  # jobspec.checks: pipeline plans exist for the GPT only
        pp = spec.parallelism.pipeline
        bounds = stage_bounds(spec.model.n_layers, dims.pp * pp.stages_per_rank, pp.split_points)
        prune_to_rank(model, bounds, rank, dims.pp)
        _apply_block_options(model, spec)
        runner = PipelineRunner(
            model,
            bounds,
            pp,
            loss=loss,
            rank=rank,
            world_size=dims.pp,
            device=device,
        )
        return Parallelized(model=model, train_model=model, mesh=mesh, pipeline=runner)
    if mesh is not None and dims.tp > 1:
        assert isinstance(model, GPT)  # jobspec.checks: tensor plans exist for the GPT only
        apply_tensor_parallel(model, mesh["tp"])
    _apply_block_options(model, spec)
    train_model: nn.Module = model
    timer: ComputeTimer | None = None
    if mesh is not None and dims.strategy == "fsdp":
        dp_mesh = mesh["dp"] if dims.tp > 1 else mesh
        apply_fsdp(model, dp_mesh, spec.parallelism.fsdp)
    elif dims.strategy == "ddp" and dims.world_size > 1:
        ids = [device.index] if device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids)
        if device.type == "cpu":
            timer = ComputeTimer()
            ddp.register_comm_hook(timer, ComputeTimer.allreduce_hook)
        train_model = ddp
    return Parallelized(
        model=model, train_model=train_model, mesh=mesh, pipeline=None, compute_timer=timer
    )


def apply_tensor_parallel(model: GPT, tp_mesh: DeviceMesh) -> None:
    """Shard each block's attention (by heads) and MLP (by inner channels) over `tp_mesh`."""
    for block in model.blocks.values():
        parallelize_module(block, tp_mesh, {name: style() for name, style in TP_PLAN.items()})


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, spec: FSDPSpec) -> None:
    """`fully_shard` each block, then the root (embeddings, final norm), over `mesh`."""
    mp_policy = MixedPrecisionPolicy(
        param_dtype=_DTYPES[spec.param_dtype] if spec.param_dtype != "fp32" else None,
        reduce_dtype=_DTYPES[spec.reduce_dtype] if spec.reduce_dtype != "fp32" else None,
    )
    # On a CPU mesh the parameters already live in host memory: offload is a no-op there.
    offload = (
        CPUOffloadPolicy() if spec.cpu_offload and mesh.device_type == "cuda" else OffloadPolicy()
    )
    for module in [getattr(container, key) for container, key in block_slots(model)] + [model]:
        fully_shard(
            module,
            mesh=mesh,
            reshard_after_forward=spec.reshard_after_forward,
            mp_policy=mp_policy,
            offload_policy=offload,
        )


def block_slots(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(container, key) of each transformer block, in order: the built-in GPT's `blocks`, or
    in a Hugging Face model (possibly inside peft) the children of a `ModuleList` whose class
    is in the model's `_no_split_modules` (the unit transformers and accelerate shard by)."""
    if isinstance(model, GPT):
        return [(model.blocks, key) for key in model.blocks]
    names: set[str] = set()
    for module in model.modules():
        names |= set(getattr(module, "_no_split_modules", None) or ())
    slots: list[tuple[nn.Module, str]] = []
    for container in model.modules():
        if isinstance(container, nn.ModuleList):
            for key, child in container.named_children():
                inner = getattr(child, "_checkpoint_wrapped_module", child)
                if type(inner).__name__ in names:
                    slots.append((container, key))
    return slots


def _apply_block_options(model: nn.Module, spec: JobSpec) -> None:
    """Activation checkpointing and `torch.compile`, per block (names keep their FQNs up to
    the `_checkpoint_wrapped_module` prefix, which DCP's state-dict helpers drop)."""
    for container, key in block_slots(model):
        block = getattr(container, key)
        if spec.train.activation_checkpointing:
            block = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        if spec.train.compile:
            _keep_4bit_eager(block)
            block.compile()
        setattr(container, key, block)


# Compiled variants Dynamo keeps per frame under QLoRA (its default, 8, is too few; above).
QLORA_RECOMPILE_LIMIT = 64


def _keep_4bit_eager(block: nn.Module) -> None:
    """QLoRA under `train.compile`: bitsandbytes' 4-bit layers run eagerly, the rest of the
    block compiled around them (a graph break each). Inductor cannot take them: the packed
    NF4 weight's fake tensor has another shape than the real one (bitsandbytes 0.50; seen
    on CPU as `assert_size_stride` failing on the weight). Their cost is one dequantization
    kernel and one matrix product, which compilation would not fuse anyway.

    The break splits peft's LoRA forward into frames Dynamo compiles separately, once per
    input dtype (fp32 after a LayerNorm under autocast, bf16 elsewhere), width (d_model or
    d_ff) and grad mode (training, eval): more than Dynamo's default `recompile_limit` of 8,
    past which it ran those frames eagerly, at half LoRA's speed on an H100 (1B GPT:
    42.6k tokens/s vs 83.5k). The limit is raised to `QLORA_RECOMPILE_LIMIT`."""
    found = False
    for module in block.modules():
        if is_bnb_4bit(module):
            module.forward = torch.compiler.disable(module.forward)
            found = True
    if found:
        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, QLORA_RECOMPILE_LIMIT)


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """FSDP2: whether the next backward reduce-scatters gradients (off while accumulating)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)


@torch.no_grad()
def clip_grad_norm(
    params: list[nn.Parameter], max_norm: float | None, *, pipeline: PipelineRunner | None
) -> float:
    """Global gradient L2 norm (before clipping); clips every gradient to `max_norm` unless
    None, with the coefficient of `torch.nn.utils.clip_grad_norm_`.

    Gradients may be plain tensors or DTensors on different meshes (FSDP's dp mesh, TP's,
    2-D): each mesh's norm is `get_total_norm(...).full_tensor()` and the parts combine as
    the root of a sum of squares; a pipeline adds the squares of all ranks. Under a pipeline
    `params` excludes the tied embedding's second copy (`PipelineRunner.norm_params`).
    """
    groups: dict[DeviceMesh | None, list[Tensor]] = {}
    for p in params:
        if p.grad is not None:
            key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            groups.setdefault(key, []).append(p.grad)
    square = torch.zeros((), dtype=torch.float32)
    for key, grads in groups.items():
        norm = torch.nn.utils.get_total_norm(grads)
        if key is not None:
            # get_total_norm is annotated -> Tensor; of DTensor gradients it returns a DTensor
            norm = norm.full_tensor()  # type: ignore[attr-defined]
        square = square + norm.float().cpu() ** 2
    if pipeline is not None:
        dist.all_reduce(square)
    total = square.sqrt()
    if max_norm is not None:
        coef = float((max_norm / (total + 1e-6)).clamp(max=1.0))
        owners = pipeline.rank_model.parameters() if pipeline else params
        for p in owners:
            if p.grad is not None:
                p.grad.mul_(coef)
    return float(total)
