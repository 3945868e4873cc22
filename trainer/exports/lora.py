"""What a LoRA run leaves behind: a PEFT adapter directory and merged full weights.

Layout under the checkpoint root (next to the `step_XXXXXXXX` checkpoints, which retention
never confuses with it):

    ROOT/lora/step_{step:08d}/adapter/   peft `save_pretrained`: adapter_config.json,
                                         adapter_model.safetensors (load with
                                         `PeftModel.from_pretrained(base, dir)`)
    ROOT/lora/step_{step:08d}/merged/    `merge_and_unload()` weights, W + (alpha / r) B A:
                                         hf: `save_pretrained` (+ tokenizer); gpt:
                                         model.safetensors + config.json (`GPTConfig`)

All ranks gather the model's full state dict (FSDP2 needs every rank: `get_model_state_dict`
with `full_state_dict=True, cpu_offload=True`, as torch documents for saving sharded models);
rank 0 then loads it into a fresh, unsharded fp32 copy of the network on the CPU and saves
from that copy (peft's `save_pretrained` cannot read sharded storages). Under QLoRA the
4-bit base weights are dequantized first (`bitsandbytes.functional.dequantize_4bit`), so the
merged model computes what the trained one did, in full precision.
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import fsspec
import torch
from safetensors.torch import save_file
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from jobspec.job import JobSpec
from trainer.checkpoint.checkpointer import directory_size
from trainer.data.byte_tokenizer import is_uri
from trainer.distributed import DistInfo
from trainer.events import Reporter
from trainer.models.gpt import GPTConfig, build_model
from trainer.models.network import Network, fqn

if TYPE_CHECKING:
    from trainer.loop import Run

ADAPTER_FORMAT = "peft_adapter"
MERGED_FORMAT = "merged_safetensors"


def export_uri(root: str, step: int) -> str:
    """Where the exports of `step` go under the checkpoint root `root`."""
    return f"{root.rstrip('/')}/lora/step_{step:08d}"


def export_lora(
    network: Network,
    spec: JobSpec,
    *,
    root: str,
    step: int,
    dist_info: DistInfo,
    reporter: Reporter,
) -> None:
    """Collective (every rank calls it): write the adapter and the merged model of `step`,
    then (reporting rank) an `export` event for each. No-op for a run without LoRA."""
    peft_model = network.peft_model
    if peft_model is None:
        return
    full = get_model_state_dict(
        peft_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if dist_info.rank != 0:
        return
    # get_model_state_dict is annotated with any state value; a module's are all tensors.
    state = _dequantized(cast(dict[str, Tensor], full), peft_model)
    fresh = _fresh_peft_model(spec, peft_model)
    fresh.load_state_dict(state, strict=True)
    uri = export_uri(root, step)
    with _staged(uri) as local:
        fresh.save_pretrained(str(local / "adapter"))
        merged = fresh.merge_and_unload()
        _save_merged(merged, network, local / "merged")
    for fmt, sub in ((ADAPTER_FORMAT, "adapter"), (MERGED_FORMAT, "merged")):
        where = f"{uri}/{sub}"
        reporter.export(step=step, format=fmt, uri=where, size_bytes=directory_size(where))


def export_at_end(run: Run) -> dict[str, Any]:
    """End hook of a LoRA run (`Run.end_hooks`): `export_lora` of its final step; the
    `completed` status data gets `lora_adapter_uri` and `lora_merged_uri`."""
    assert run.network is not None
    root, step = run.checkpointer.root, run.state.step
    export_lora(
        run.network, run.spec, root=root, step=step, dist_info=run.dist, reporter=run.reporter
    )
    uri = export_uri(root, step)
    return {"lora_adapter_uri": f"{uri}/adapter", "lora_merged_uri": f"{uri}/merged"}


def _dequantized(state: dict[str, Tensor], peft_model: nn.Module) -> dict[str, Tensor]:
    """`state` with each bitsandbytes 4-bit weight replaced by its fp32 dequantization
    (out, in) and the quantization-state entries saved next to it dropped."""
    if not any(type(m).__name__ == "Linear4bit" for m in peft_model.modules()):
        return state
    import bitsandbytes as bnb

    quantized = {  # bitsandbytes' own layers, not peft's LoRA wrappers of the same name
        fqn(name): module
        for name, module in peft_model.named_modules()
        if isinstance(module, bnb.nn.Linear4bit)
    }
    out = {
        k: v
        for k, v in state.items()
        if not any(k.startswith(f"{name}.weight.") for name in quantized)
    }
    for name, module in quantized.items():
        packed = module.weight
        assert isinstance(packed, bnb.nn.Params4bit)  # a Linear4bit's weight
        weight = bnb.functional.dequantize_4bit(packed.data, packed.quant_state)
        out[f"{name}.weight"] = weight.float().cpu()
    return out


def _fresh_peft_model(spec: JobSpec, trained: Any) -> Any:
    """An unsharded, unquantized fp32 copy of the trained network's architecture on the CPU,
    with the same LoRA configuration (its values are overwritten by the caller)."""
    from peft import get_peft_model

    cpu = torch.device("cpu")
    base: nn.Module
    if spec.model.kind == "gpt":
        base = build_model(GPTConfig.from_spec(spec.model), device=cpu, seed=spec.seed)
    else:
        from transformers import AutoModelForCausalLM

        config = copy.deepcopy(trained.get_base_model().config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        base = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    config = copy.deepcopy(trained.peft_config["default"])
    return get_peft_model(base, config)


def _save_merged(merged: nn.Module, network: Network, out: Path) -> None:
    save_pretrained = getattr(merged, "save_pretrained", None)
    if save_pretrained is not None:  # a transformers model
        save_pretrained(str(out))
        if network.tokenizer is not None:
            network.tokenizer.save_pretrained(str(out))
        return
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in merged.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = merged.cfg
    assert isinstance(cfg, GPTConfig)  # not a transformers model: the built-in GPT
    config = {"model_type": "torchyard-gpt", **asdict(cfg)}
    (out / "config.json").write_text(json.dumps(config, indent=2))


@contextmanager
def _staged(uri: str) -> Iterator[Path]:
    """A local directory to write `uri`'s files in: `uri` itself when local, else a
    temporary directory uploaded to `uri` through fsspec on success."""
    if not is_uri(uri):
        path = Path(uri)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    fs, remote = fsspec.core.url_to_fs(uri)
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)
        for file in sorted(p for p in Path(tmp).rglob("*") if p.is_file()):
            fs.put_file(str(file), f"{remote}/{file.relative_to(tmp).as_posix()}")
