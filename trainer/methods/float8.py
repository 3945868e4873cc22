"""`train.precision: fp8`: float8 training of the blocks' Linear layers with torchao.

`apply_float8(model, recipe, device)` swaps each eligible `nn.Linear` for torchao's
`Float8Linear` (`torchao.float8.convert_to_float8_training`) before tensor/data parallelism,
activation checkpointing and compilation, in torchtitan's order. A `Float8Linear` keeps the
Linear's fp32 `weight` and `bias` (the same state-dict keys: checkpoints, resumes and exports
read as a bf16 run's), and in each forward casts its input (B, T, in_features) and weight
(out_features, in_features) to e4m3 with dynamic scales, multiplies with `torch._scaled_mm`
(bf16 out), and casts the output gradient to e5m2 in backward (Micikevicius et al. 2022,
"FP8 Formats for Deep Learning"). The rest of the model runs under bf16 autocast
(`trainer.methods.base.autocast`).

Eligible: both widths divisible by 16 (`torch._scaled_mm`'s constraint) and not the output
head (`lm_head`; the built-in GPT's is tied to the embedding, no Linear), which stays bf16 as
in torchtitan: its logits feed the loss directly.

Raises `InvalidJobError` on a CUDA device older than compute capability 8.9 (no float8 tensor
cores: Ada, Hopper and later have them). On CPU torch's own `_scaled_mm` kernels run it (the
same formats, at CPU speed: the suite's path).
"""

from __future__ import annotations

import torch
from torch import nn

from dataformat.errors import InvalidJobError

FP8_MIN_CAPABILITY = (8, 9)  # Ada (sm_89), Hopper (sm_90), Blackwell (sm_100)
HEAD_NAMES = ("lm_head",)


def fp8_refusal(device: torch.device) -> str | None:
    """Why `device` cannot train in float8, or None when it can."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= FP8_MIN_CAPABILITY:
        return None
    name = torch.cuda.get_device_name(device)
    return (
        f"train.precision fp8 needs float8 tensor cores (CUDA compute capability 8.9 or later: "
        f"Ada, Hopper, Blackwell); this job's GPU {name} is sm_{major}{minor}: use bf16"
    )


def converts(module: nn.Module, fqn: str) -> bool:
    """Whether `module` (at `fqn` in the model) becomes a `Float8Linear`."""
    if not isinstance(module, nn.Linear):
        return False
    if fqn.rsplit(".", 1)[-1] in HEAD_NAMES:
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_float8(model: nn.Module, recipe: str, device: torch.device) -> int:
    """Swap `model`'s eligible Linears for `Float8Linear` with torchao's `recipe`
    (`tensorwise` or `rowwise`), in place; the number swapped.

    Raises `InvalidJobError` when `device` has no float8 support (`fp8_refusal`) or no Linear
    of the model is eligible."""
    refusal = fp8_refusal(device)
    if refusal is not None:
        raise InvalidJobError(refusal)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=config, module_filter_fn=converts)
    swapped = sum(isinstance(m, Float8Linear) for m in model.modules())
    if not swapped:
        raise InvalidJobError(
            "train.precision fp8: no Linear layer of this model has both widths divisible by 16"
        )
    return swapped
