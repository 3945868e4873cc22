"""Export a DCP checkpoint to one consolidated `model.safetensors` plus `config.json`.

    python -m trainer.exports.safetensors --checkpoint CKPT_URI/step_00000100 --out DIR

Only the model weights are read (`model_optim.model.*`, not the optimizer state), whatever
parallelism and world size saved them: DCP's `_load_state_dict_from_keys` assembles the full
tensors in this one process, and `safetensors.torch.save_file` writes them (fp32, names as in
`GPT.state_dict()`). `config.json` carries the `GPTConfig` and the step, so `load_exported`
(or any reader of safetensors) can rebuild the network without Torchyard's job spec.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fsspec
import safetensors.torch
import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

from jobspec.job import JobSpec
from trainer.checkpoint.checkpointer import _reader, checkpoint_spec
from trainer.data.byte_tokenizer import is_uri
from trainer.models.gpt import GPT, GPTConfig

if TYPE_CHECKING:
    from trainer.loop import Run

MODEL_PREFIX = "model_optim.model."  # checkpoint keys of the weights (trainer.checkpoint.state)
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MODEL_TYPE = "torchyard-gpt"
EXPORT_DIR = "export"
log = logging.getLogger(__name__)


def load_model_weights(
    checkpoint_uri: str, process_group: dist.ProcessGroup | None = None
) -> dict[str, Tensor]:
    """The full (unsharded) model weights of a complete checkpoint, keyed like
    `GPT.state_dict()`, on CPU. In a job with a process group, every rank of `process_group`
    (default: all) must call it. Raises `FileNotFoundError` (no `.metadata`: incomplete or
    absent) and `ValueError` (no model weights in it)."""
    metadata = _reader(checkpoint_uri).read_metadata()
    keys = {k for k in metadata.state_dict_metadata if k.startswith(MODEL_PREFIX)}
    if not keys:
        raise ValueError(f"{checkpoint_uri} holds no model weights ({MODEL_PREFIX}*)")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", "torch.distributed is unavailable")
        loaded = _load_state_dict_from_keys(
            keys, storage_reader=_reader(checkpoint_uri), process_group=process_group
        )
    weights = loaded["model_optim"]["model"]
    return {name: tensor.contiguous() for name, tensor in weights.items()}


def write_model_dir(
    out: str,
    tensors: dict[str, Tensor],
    config: dict[str, Any],
    metadata: dict[str, str] | None = None,
) -> str:
    """Write `out/model.safetensors` (with string `metadata`) and `out/config.json`; `out` is
    a local directory or an fsspec URI. Returns the safetensors file's location."""
    fs, path = fsspec.core.url_to_fs(out)
    fs.makedirs(path, exist_ok=True)
    weights = f"{path.rstrip('/')}/{WEIGHTS_FILE}"
    if is_uri(out):
        fs.pipe_file(weights, safetensors.torch.save(tensors, metadata=metadata))
    else:
        safetensors.torch.save_file(tensors, weights, metadata=metadata)
    fs.pipe_file(f"{path.rstrip('/')}/{CONFIG_FILE}", json.dumps(config, indent=2).encode())
    return f"{out.rstrip('/')}/{WEIGHTS_FILE}"


def model_config(spec: JobSpec, **extra: Any) -> dict[str, Any]:
    """`config.json`: the `GPTConfig` fields, `model_type` and `extra` (step, source, ...)."""
    cfg = GPTConfig.from_spec(spec.model)
    return {"model_type": MODEL_TYPE, **dataclasses.asdict(cfg), **extra}


def export_safetensors(
    checkpoint_uri: str, out: str, process_group: dist.ProcessGroup | None = None
) -> str:
    """Consolidate the checkpoint at `checkpoint_uri` (a `step_XXXXXXXX` directory) into
    `out/model.safetensors` + `out/config.json`; returns the safetensors location.

    Raises `FileNotFoundError` for a missing or incomplete checkpoint, `ValueError` for one
    without model weights. `process_group`: as for `load_model_weights`.
    """
    spec = checkpoint_spec(checkpoint_uri)
    weights = load_model_weights(checkpoint_uri, process_group)
    step = checkpoint_uri.rstrip("/").rsplit("_", 1)[-1]
    config = model_config(
        spec,
        torch_dtype=str(next(iter(weights.values())).dtype).removeprefix("torch."),
        step=int(step) if step.isdigit() else None,
        source_checkpoint=checkpoint_uri,
    )
    return write_model_dir(out, weights, config, metadata={"format": "pt"})


def export_at_end(run: Run) -> dict[str, Any]:
    """End hook (`checkpoint.export_safetensors`): export the run's final, complete checkpoint
    to `CKPT_ROOT/export/`. Every rank calls it; the reporting rank alone reads and writes,
    over a process group of its own. Returns the `completed` field `export_uri`."""
    uri = run.checkpointer.last_saved_uri
    assert uri is not None  # `_finish` saved the final step before the end hooks
    out = f"{run.checkpointer.root.rstrip('/')}/{EXPORT_DIR}"
    writer = run.dims.reporting_rank
    group = dist.new_group([writer], backend="gloo") if run.dist.is_distributed else None
    location = f"{out}/{WEIGHTS_FILE}"
    if run.dist.rank == writer:
        location = export_safetensors(uri, out, group)
        log.info("exported %s to %s", uri, location)
    return {"export_uri": location}


def load_exported(out: str, device: torch.device | str = "cpu") -> GPT:
    """Rebuild the `GPT` an `export_safetensors` directory holds (eval mode)."""
    fs, path = fsspec.core.url_to_fs(out)
    config = json.loads(fs.cat_file(f"{path.rstrip('/')}/{CONFIG_FILE}"))
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    cfg = GPTConfig(**{k: v for k, v in config.items() if k in fields})
    state = safetensors.torch.load(fs.cat_file(f"{path.rstrip('/')}/{WEIGHTS_FILE}"))
    with torch.device("meta"):
        model = GPT(cfg)
    model.load_state_dict(state, assign=True, strict=True)
    return model.to(device).eval()


def main(argv: list[str] | None = None) -> int:
    """CLI: exit 0 with the safetensors location on stdout; 2 for an unusable checkpoint."""
    p = argparse.ArgumentParser(
        prog="python -m trainer.exports.safetensors", description=__doc__.split("\n")[0]
    )
    p.add_argument("--checkpoint", required=True, help="a step_XXXXXXXX checkpoint dir or URI")
    p.add_argument("--out", required=True, help="output directory or fsspec URI")
    args = p.parse_args(argv)
    checkpoint = args.checkpoint if is_uri(args.checkpoint) else str(Path(args.checkpoint))
    try:
        print(export_safetensors(checkpoint, args.out))
    except (FileNotFoundError, ValueError) as exc:
        print(f"trainer.exports.safetensors: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
