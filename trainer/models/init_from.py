"""The starting weights of a fine-tune (`model.init_from`): an earlier job's checkpoint.

`load_starting_weights` gives the job's base model (before its own adapters, before any
sharding) the weights of the checkpoint `--init-from` names, whatever the source trained:

- a full checkpoint (the source trained every weight): its model weights, by name
  (`trainer.checkpoint.checkpointer.load_model_only`; DCP reshards whatever layout saved them);
- an adapter checkpoint (the source was a LoRA run, whose checkpoints hold only its
  adapters and `modules_to_save`): the source's network is rebuilt from the spec saved with
  the checkpoint (its frozen base comes from the same seeded init or model files every
  attempt of the source used), its adapters are read from the checkpoint and merged into the
  base (peft's `merge_and_unload`: W + (alpha / r) B A), and the merged weights are what
  this job starts from.

So a LoRA job from a LoRA job trains new adapters on the merged model, and with its adapters
disabled computes exactly the source's trained model: the reference of DPO after LoRA SFT is
the SFT model (Rafailov et al. 2023 start DPO from the SFT policy and use it as reference).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

from dataformat.errors import InvalidJobError
from jobspec.job import JobSpec
from trainer.checkpoint.checkpointer import checkpoint_spec, load_model_only
from trainer.distributed import DistInfo
from trainer.models.hf import HFCausalLM

# Builds the LoRA run `source` with the adapters of its checkpoint `uri` merged into its base
# (`trainer.models.network.merged_source`): passed in, since building networks is the
# models package's, which imports this module.
MergeSource = Callable[[JobSpec, str, DistInfo], nn.Module]

log = logging.getLogger(__name__)


def source_spec(uri: str) -> JobSpec | None:
    """The spec saved with the checkpoint at `uri`, or None when it has none this trainer
    can read (a checkpoint of an older spec version: treated as a full checkpoint)."""
    try:
        return checkpoint_spec(uri)
    except (OSError, ValueError):
        return None


def load_starting_weights(
    base: nn.Module, spec: JobSpec, uri: str, *, dist_info: DistInfo, merge_source: MergeSource
) -> None:
    """Give `base` (the built-in GPT, or the `transformers` model of a `kind: hf` job, before
    adapters and sharding) the weights of the checkpoint at `uri`, full or merged from the
    adapters of a LoRA source (the module doc; `merge_source` rebuilds and merges that source).
    Every rank calls it (DCP reads collectively).

    Raises `InvalidJobError` when the checkpoint does not fit the model, or holds the
    adapters of a source this cannot rebuild: a QLoRA run (4-bit base), or a LoRA run that
    itself started from `model.init_from` (its base is another job's checkpoint).
    """
    source = source_spec(uri)
    if source is None or (source.lora is None and source.qlora is None):
        load_model_only(_as_trained(base, spec), uri, dist_info=dist_info)
        return
    if source.qlora is not None:
        raise InvalidJobError(
            f"init_from: {uri} holds the adapters of a QLoRA run on a 4-bit base; start "
            "from its merged export or a full checkpoint instead"
        )
    if source.model.init_from is not None:
        raise InvalidJobError(
            f"init_from: {uri} holds the adapters of a LoRA run that itself started from "
            f"job {source.model.init_from.job}'s checkpoint; chains of LoRA fine-tunes are "
            "not rebuilt: start from a full checkpoint"
        )
    merged = merge_source(source, uri, dist_info)
    missing, unexpected = base.load_state_dict(merged.state_dict(), strict=False)
    if missing or unexpected:
        raise InvalidJobError(
            f"init_from: the merged model of {uri} does not fit this job's model "
            f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    log.info("initialized the model from the merged LoRA adapters of %s", uri)


def _as_trained(base: nn.Module, spec: JobSpec) -> nn.Module:
    """`base` as the trainer's checkpoints name its weights: a `transformers` model inside
    `HFCausalLM` (`lm.` prefix), the built-in GPT as it is."""
    if spec.model.kind == "hf":
        return HFCausalLM(base, seq_len=spec.model.seq_len)
    return base
