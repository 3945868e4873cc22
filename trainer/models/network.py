"""The network a job trains, with LoRA (Hu et al. 2021) and QLoRA (Dettmers et al. 2023).

`build_network(spec, device)` builds the built-in GPT or a Hugging Face causal LM
(`trainer.models.hf`) and, before any sharding (docs/ARCHITECTURE.md, 'Trainer build order'):
- `qlora`: replaces the frozen linear layers of the blocks with `bitsandbytes` 4-bit
  `Linear4bit` (NF4, double quantization, a compute dtype; a `path_or_id` model is loaded
  with the equivalent `BitsAndBytesConfig`), then peft's `prepare_model_for_kbit_training`;
- `lora`/`qlora`: peft's `get_peft_model` with a `LoraConfig`. The adapters' random init is
  drawn from the job seed on every rank alike, so sharded (FSDP2) and replicated runs start
  from the single-process weights. Only adapters (and `modules_to_save`) require grad.

The frozen base is rebuilt identically from its source on each attempt (seeded init, model
files), so checkpoints hold only the trainable parameters (`model_state`). At the end of a
LoRA run `trainer.exports.lora` writes a PEFT adapter directory and merged weights.

peft, transformers and bitsandbytes are imported only when a job uses them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.nn.parallel import DistributedDataParallel

from dataformat.errors import InvalidJobError
from jobspec.checks import GPT_LINEAR_MODULES
from jobspec.job import JobSpec, LoRASpec, QLoRASpec
from trainer.checkpoint.checkpointer import load_model_only
from trainer.checkpoint.state import ModelOptimizerState
from trainer.distributed import DistInfo
from trainer.models.gpt import GPTConfig, build_model
from trainer.models.hf import HFCausalLM, build_hf_model, data_vocab_size, load_tokenizer
from trainer.models.init_from import load_starting_weights

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import BitsAndBytesConfig, PreTrainedTokenizerBase

log = logging.getLogger(__name__)
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Wrapper prefixes that DCP's state-dict helpers drop from parameter names.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


@dataclass
class Network:
    """The model to parallelize, and what the rest of the run needs to know about it."""

    model: nn.Module  # GPT (adapters injected in place) or HFCausalLM
    peft_model: PeftModel | None  # the peft wrapper around the base (LoRA runs), for export
    tokenizer: PreTrainedTokenizerBase | None  # None: token id = byte value
    num_params: int  # all parameters; a 4-bit weight counts its unpacked elements
    trainable_params: int  # parameters the optimizer updates
    vocab_size: int  # ids the data can hold (256 for bytes)


def lora_settings(spec: JobSpec) -> LoRASpec | None:
    """The adapters of the job: `spec.lora`, or LoRA defaults under `qlora` alone."""
    if spec.lora is not None:
        return spec.lora
    return LoRASpec() if spec.qlora is not None else None


def build_network(
    spec: JobSpec,
    *,
    device: torch.device,
    init_from: str | None = None,
    dist_info: DistInfo | None = None,
) -> Network:
    """Build the model of `spec` on `device`, quantized and/or with adapters as asked;
    `init_from` (a complete checkpoint: full, or a LoRA run's adapters, merged) gives the
    base its weights first, before quantization and adapters (`trainer.models.init_from`; every
    rank reads them whole: `dist_info` says whether there is a process group).

    Raises `InvalidJobError` for a model that cannot be built, LoRA targets it lacks, a
    checkpoint that does not fit, or QLoRA where bitsandbytes is missing.
    """
    lora, qlora = lora_settings(spec), spec.qlora
    tokenizer = load_tokenizer(spec.model)
    if spec.model.kind == "gpt":
        base: nn.Module = build_model(
            GPTConfig.from_spec(spec.model), device=device, seed=spec.seed
        )
        _apply_init_from(base, spec, init_from, dist_info)
        if qlora is not None:
            quantize_linears(base.blocks, qlora, device=device)  # type: ignore[arg-type]
    else:
        from_files = spec.model.hf is not None and spec.model.hf.path_or_id is not None
        bnb_config = bnb_4bit_config(qlora) if qlora is not None and from_files else None
        if bnb_config is not None and init_from is not None:
            raise InvalidJobError(
                "model.init_from with qlora on a model loaded from files (4-bit on load) is "
                "not supported; use lora, or a from_config model"
            )
        base = build_hf_model(spec.model, device=device, seed=spec.seed, quantization=bnb_config)
        _apply_init_from(base, spec, init_from, dist_info)
        if qlora is not None and not from_files:
            head = base.get_output_embeddings()
            if not quantize_linears(base, qlora, device=device, skip={id(head)}):
                raise InvalidJobError(
                    "qlora: the model has no nn.Linear layer to quantize (GPT-2 uses Conv1D)"
                )
    peft_model = None
    if lora is not None:
        peft_model = apply_lora(base, lora, spec, device=device)
    if qlora is not None:
        autocast_4bit_inputs(base)
    if spec.model.kind == "gpt":
        model = base
    else:
        model = HFCausalLM(peft_model or base, seq_len=spec.model.seq_len)
    trainable, total = count_params(peft_model or model)
    return Network(
        model=model,
        peft_model=peft_model,
        tokenizer=tokenizer,
        num_params=total,
        trainable_params=trainable,
        vocab_size=data_vocab_size(tokenizer),
    )


def _apply_init_from(
    base: nn.Module, spec: JobSpec, init_from: str | None, dist_info: DistInfo | None
) -> None:
    if init_from is None:
        return
    assert dist_info is not None
    load_starting_weights(base, spec, init_from, dist_info=dist_info, merge_source=merged_source)


def merged_source(source: JobSpec, uri: str, dist_info: DistInfo) -> nn.Module:
    """The base model of the LoRA run `source` with the adapters of its checkpoint `uri`
    merged in (W + (alpha / r) B A, `modules_to_save` replacing their modules), fp32, on
    this rank's device; the GPT or the `transformers` model, without peft wrappers."""
    network = build_network(source, device=dist_info.device, dist_info=dist_info)
    assert network.peft_model is not None  # the source spec has lora
    names = trainable_names(network.model)
    load_model_only(network.model, uri, dist_info=dist_info, names=names)
    with torch.no_grad():
        merged: nn.Module = network.peft_model.merge_and_unload()
    return merged


def bnb_4bit_config(qlora: QLoRASpec) -> BitsAndBytesConfig:
    """`transformers.BitsAndBytesConfig` for 4-bit loading as the QLoRA paper does it."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=qlora.quant_type,
        bnb_4bit_use_double_quant=qlora.double_quant,
        bnb_4bit_compute_dtype=_DTYPES[qlora.compute_dtype],
    )


def _bnb() -> Any:
    try:
        import bitsandbytes as bnb
    except ImportError as exc:  # the API cannot know what the workers have installed
        raise InvalidJobError(f"qlora needs bitsandbytes on the workers: {exc}") from exc
    return bnb


def is_bnb_4bit(module: nn.Module) -> bool:
    """bitsandbytes' own `Linear4bit` (told by class, so bitsandbytes is not imported)."""
    kind = type(module)
    return kind.__name__ == "Linear4bit" and kind.__module__.startswith("bitsandbytes.")


def _is_4bit_linear(module: nn.Module) -> bool:
    """bitsandbytes' `Linear4bit`, or a peft LoRA layer around one (its `base_layer`; peft
    picks its bitsandbytes-aware class on CUDA and the generic `Linear` on CPU)."""
    base = getattr(module, "base_layer", None)
    return is_bnb_4bit(module) or (isinstance(base, nn.Module) and _is_4bit_linear(base))


def _autocast_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Forward pre-hook: a floating input becomes the autocast dtype while autocast is on."""
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return None
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return None
    dtype = torch.get_autocast_dtype(device)
    return None if x.dtype == dtype else (x.to(dtype), *args[1:])


def autocast_4bit_inputs(model: nn.Module) -> int:
    """Make `model`'s 4-bit linear layers (and peft's LoRA layers around them) take their
    input in the autocast dtype, as autocast does for `nn.Linear`; returns how many.

    bitsandbytes' `Linear4bit` is no autocast op: it computes in its `compute_dtype` but
    returns its input's dtype, and a LayerNorm under autocast hands it fp32. Each such layer
    then wrote fp32 (B, T, d_out) outputs that peft cloned and added to in fp32: on an H100
    (1B GPT, compiled, 16k tokens per step) fp32 copies and adds took ~120 of 367 ms per step
    (`train.profile`). In the autocast dtype they are half the bytes and no extra pass."""
    count = 0
    for module in model.modules():
        if _is_4bit_linear(module):
            module.register_forward_pre_hook(_autocast_input)
            # bitsandbytes repacks a CPU layer's weight for inference at its first forward in
            # eval mode without grad (an evaluation at step 0: `eval.at_start`, `init_from`)
            # and never back, and its training forward then fails (`result += bias` on a
            # view); a training job keeps the training layout.
            setattr(module, "support_avx512bf16_for_cpu", False)  # noqa: B010 - typed as Module
            count += 1
    return count


def quantize_linears(
    root: nn.Module, qlora: QLoRASpec, *, device: torch.device, skip: set[int] | None = None
) -> int:
    """Replace every `nn.Linear` under `root` (but those whose `id` is in `skip`) by a frozen
    `bitsandbytes.nn.Linear4bit` holding its weight quantized to 4 bits (blockwise, 64 values
    per block; double quantization compresses the block scales). Returns how many.

    Weight (out, in) fp32 -> packed uint8 (out * in / 2, 1) + quantization state; the bias
    stays as it was. Quantization happens when the weight moves to `device`.
    """
    bnb = _bnb()
    replaced = 0
    for name, module in list(root.named_modules()):
        if not isinstance(module, nn.Linear) or isinstance(module, bnb.nn.Linear4bit):
            continue
        if id(module) in (skip or set()):
            continue
        quantized = bnb.nn.Linear4bit(
            module.in_features,
            module.out_features,
            bias=module.bias is not None,
            compute_dtype=_DTYPES[qlora.compute_dtype],
            compress_statistics=qlora.double_quant,
            quant_type=qlora.quant_type,
            device="meta",
        )
        quantized.weight = bnb.nn.Params4bit(
            module.weight.data,
            requires_grad=False,
            compress_statistics=qlora.double_quant,
            quant_type=qlora.quant_type,
        )
        quantized.bias = module.bias
        parent_name, _, child = name.rpartition(".")
        setattr(root.get_submodule(parent_name), child, quantized.to(device))
        replaced += 1
    return replaced


def apply_lora(base: nn.Module, lora: LoRASpec, spec: JobSpec, *, device: torch.device) -> Any:
    """Wrap `base` with peft LoRA adapters (in place: `base`'s targeted layers become
    `peft.tuners.lora.Linear`); returns the `PeftModel`. Everything else is frozen.

    The adapters' `A` matrices (Kaiming-uniform) and dropout masks come from torch's global
    RNG, forked and seeded with the job seed here, so every rank draws the same adapters.
    Raises `InvalidJobError` when a target module does not exist in `base`.
    """
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    gpt = spec.model.kind == "gpt"
    targets: list[str] | str
    if lora.target_modules is not None:
        targets = list(lora.target_modules)
        _check_targets(base, targets)
    else:  # every linear layer of the blocks, as in QLoRA
        targets = [m.split(".")[-1] for m in GPT_LINEAR_MODULES] if gpt else "all-linear"
    if spec.qlora is not None:
        prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft annotates int; it divides by r
        lora_dropout=lora.dropout,
        target_modules=targets,
        modules_to_save=list(lora.modules_to_save) or None,
        task_type=None if gpt else "CAUSAL_LM",
    )
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(spec.seed)
        try:
            return get_peft_model(base, config)
        except ValueError as exc:
            raise InvalidJobError(f"lora: {exc}") from exc


def _check_targets(base: nn.Module, targets: list[str]) -> None:
    """Each target must name a module (peft matches the full path or a dotted suffix)."""
    names = [name for name, _ in base.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        linear = sorted(
            {n.rsplit(".", 1)[-1] for n, m in base.named_modules() if _is_linear_like(m)}
        )
        raise InvalidJobError(
            f"lora.target_modules {missing} do not exist in the model; its linear layers "
            f"are named {linear}"
        )


def _is_linear_like(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def count_params(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts; a 4-bit weight counts its logical elements."""
    counter = getattr(model, "get_nb_trainable_parameters", None)
    if counter is not None:  # peft's, which knows the packing of 4-bit weights
        trainable, total = counter()
        return int(trainable), int(total)
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def trainable_names(model: nn.Module) -> set[str]:
    """Names of the trainable parameters as DCP's state-dict helpers key them (without the
    `module.` of DDP or the prefixes of activation-checkpoint and compile wrappers)."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    return {fqn(name) for name, p in inner.named_parameters() if p.requires_grad}


def fqn(name: str) -> str:
    """A parameter or module name without activation-checkpoint and compile wrapper parts."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


_ADAPTER_OPTIONS = StateDictOptions(
    flatten_optimizer_state_dict=True, ignore_frozen_params=True, strict=False
)


class AdapterOptimizerState(ModelOptimizerState):
    """`ModelOptimizerState` of a LoRA run: the trainable parameters (adapters,
    `modules_to_save`) and the optimizer only. The frozen base, 4-bit or not, is rebuilt
    from its source on resume; DCP reshards the adapters like any parameter."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().__init__(model, optimizer)
        self.trainable = trainable_names(model)

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=_ADAPTER_OPTIONS)
        # ignore_frozen_params keeps the quantization state bitsandbytes adds next to weights
        model_sd = {k: v for k, v in model_sd.items() if k in self.trainable}
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=_ADAPTER_OPTIONS,
        )


def model_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, network: Network
) -> ModelOptimizerState:
    """What checkpoints save of model and optimizer: adapters only for LoRA runs."""
    if network.peft_model is not None:
        return AdapterOptimizerState(model, optimizer)
    return ModelOptimizerState(model, optimizer)
