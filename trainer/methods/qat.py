"""Quantization-aware training with torchao's QAT API (`torchao.quantization.qat.QATConfig`).

`prepare` swaps every `nn.Linear` for torchao's `FakeQuantizedLinear` before the model is
sharded: the forward rounds inputs to int8 per token (dynamic, asymmetric) and weights to
`qat.weight_dtype` per group of `qat.group_size` input channels (symmetric), the backward
passes gradients straight through (Jacob et al. 2018, "Quantization and Training of Neural
Networks for Efficient Integer-Arithmetic-Only Inference"). Parameter names do not change, so
checkpoints load into QAT and non-QAT models alike.

At the end of a completed run (`report_converted`, a `Run.end_hook`) the full weights are
gathered into a local copy on every rank, evaluated fake-quantized, converted with
`QATConfig(step="convert")` into real quantized weights (torchao's
`Int8DynamicActivationIntxWeightConfig`; `Int4WeightOnlyConfig` has no CPU kernel) and
evaluated again; both losses are reported (`eval_loss_qat_fake`, `eval_loss_qat_converted`)
and the converted model is saved as `CKPT_ROOT/qat_converted/model.safetensors` (torchao's
safetensors flattening of its tensor subclasses) with `config.json`. The local copy holds the
fp32 master weights: under FSDP with `param_dtype: bf16` its fake-quantized loss differs a
little from the run's own `eval_loss` (computed with bf16 gathered parameters).

Memory: the whole model once more per rank (fine for the models QAT targets on one host).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import safetensors
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torchao.prototype.safetensors.safetensors_support import (
    flatten_tensor_state_dict,
    unflatten_tensor_state_dict,
)
from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
from torchao.quantization.granularity import PerGroup
from torchao.quantization.qat import QATConfig

from jobspec.job import JobSpec, QATSpec
from trainer.exports.safetensors import CONFIG_FILE, WEIGHTS_FILE, model_config, write_model_dir
from trainer.models.gpt import GPT, GPTConfig, build_model

if TYPE_CHECKING:
    from trainer.loop import Run

log = logging.getLogger(__name__)
CONVERTED_DIR = "qat_converted"
# torch.int4 exists at runtime (a shell dtype) but not in torch's stubs.
_WEIGHT_DTYPES = {"int4": torch.int4, "int8": torch.int8}  # type: ignore[attr-defined]


def base_config(spec: QATSpec) -> Int8DynamicActivationIntxWeightConfig:
    """The post-training quantization the fake quantizers simulate and `convert` applies."""
    return Int8DynamicActivationIntxWeightConfig(
        weight_dtype=_WEIGHT_DTYPES[spec.weight_dtype],
        weight_granularity=PerGroup(spec.group_size),
    )


def prepare(model: nn.Module, spec: QATSpec) -> None:
    """Fake-quantize `model`'s Linear layers in place (call before sharding/wrapping)."""
    quantize_(model, QATConfig(base_config(spec), step="prepare"))


def convert(model: nn.Module, spec: QATSpec) -> None:
    """Replace the fake-quantized Linears of a prepared `model` by quantized ones, in place."""
    quantize_(model, QATConfig(base_config(spec), step="convert"))


def local_prepared_copy(
    cfg: GPTConfig, state: dict[str, torch.Tensor], spec: QATSpec, device: torch.device
) -> GPT:
    """A whole, unsharded fake-quantized `GPT` on `device` holding the weights `state`."""
    model = build_model(cfg, device=device, seed=0)
    prepare(model, spec)
    model.load_state_dict(state, strict=True)
    return model


def report_converted(run: Run) -> dict[str, Any]:
    """End hook of a QAT run: eval loss fake-quantized vs converted, converted model saved.

    Collective (every rank gathers the full weights and evaluates its own eval batches).
    Returns the `completed` status fields `eval_loss_qat_fake`, `eval_loss_qat_converted` and
    `qat_converted_uri`; also reports both losses as metrics at the final step.
    """
    from trainer.methods.sft import evaluate  # QAT is imported for QAT runs only

    spec = run.spec
    assert spec.qat is not None
    full = get_model_state_dict(
        run.parallel_model, options=StateDictOptions(full_state_dict=True)
    )  # every rank gets the whole tensors (FSDP all-gathers them)
    cfg = run.model.cfg
    assert isinstance(cfg, GPTConfig)  # jobspec.checks: qat is for the built-in GPT only
    # get_model_state_dict is annotated with any state value; a module's are all tensors.
    local = local_prepared_copy(cfg, cast(dict[str, torch.Tensor], full), spec.qat, run.dist.device)
    del full
    fake_loss = evaluate(run, model=local)
    convert(local, spec.qat)
    converted_loss = evaluate(run, model=local)
    uri = f"{run.checkpointer.root.rstrip('/')}/{CONVERTED_DIR}"
    if run.dist.rank == run.dims.reporting_rank:
        save_converted(local, spec, uri, step=run.state.step)
        log.info(
            "qat: eval loss fake-quantized %.5f, converted %.5f; saved %s",
            fake_loss, converted_loss, uri,
        )  # fmt: skip
    values = {"eval_loss_qat_fake": fake_loss, "eval_loss_qat_converted": converted_loss}
    run.reporter.metric(run.state.step, values)
    return {**values, "qat_converted_uri": uri}


def save_converted(model: nn.Module, spec: JobSpec, out: str, *, step: int) -> str:
    """Write a converted model to `out/model.safetensors` (torchao tensor subclasses
    flattened into plain tensors + JSON metadata) and `out/config.json` (with the QAT config).
    Returns the safetensors location."""
    assert spec.qat is not None
    tensors, metadata = flatten_tensor_state_dict(model.state_dict())
    config = model_config(spec, step=step, quantization={"qat": spec.qat.model_dump()})
    return write_model_dir(out, {k: v.contiguous() for k, v in tensors.items()}, config, metadata)


def load_converted(out: str | Path, device: torch.device | str = "cpu") -> GPT:
    """Rebuild a converted model saved by `save_converted` in the local directory `out`
    (eval mode, on `device`). Raises `ValueError` when the file holds tensors the metadata
    does not name."""
    out = Path(out)
    config = json.loads((out / CONFIG_FILE).read_text())
    qat = QATSpec.model_validate(config["quantization"]["qat"])
    cfg = GPTConfig(**{k: config[k] for k in GPTConfig.__dataclass_fields__})
    with safetensors.safe_open(str(out / WEIGHTS_FILE), framework="pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    state, leftover = unflatten_tensor_state_dict(tensors, metadata)
    if leftover:
        raise ValueError(f"{out}: tensors not in the metadata: {sorted(leftover)[:5]}")
    model = build_model(cfg, device=torch.device(device), seed=0)
    prepare(model, qat)
    convert(model, qat)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()
