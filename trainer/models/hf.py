"""Hugging Face `transformers` causal LMs as trainer models (`model.kind: hf`).

`build_hf_model` loads `AutoModelForCausalLM.from_pretrained(path_or_id)` (a local directory
or a hub id; 4-bit through `BitsAndBytesConfig` for QLoRA) or builds one from a config dict
(`AutoConfig.for_model` + `from_config`) with weights drawn from the job seed, the same on
every rank. `HFCausalLM` gives it the trainer's calling convention, token ids (B, T) int64 ->
logits (B, T, vocab_size). Data is bytes unless the model directory has a tokenizer
(`AutoTokenizer`, `load_tokenizer`), which `trainer.data.prep.prepare_rows` then applies.

`transformers` is imported inside the functions, so runs of the built-in GPT do not pay for it.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from dataformat.errors import InvalidJobError
from jobspec.job import ModelSpec
from trainer.data.byte_tokenizer import is_uri
from trainer.models.gpt import VOCAB_SIZE

if TYPE_CHECKING:
    from transformers import BitsAndBytesConfig, PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True, kw_only=True)
class LMShape:
    """What sampling and the MFU estimate read of a model (as of a `GPTConfig`)."""

    seq_len: int  # longest context the trainer feeds, in tokens
    vocab_size: int  # logits per position
    n_layers: int  # transformer blocks
    d_model: int  # hidden size


class HFCausalLM(nn.Module):
    """A `transformers` causal LM (or a peft model around one): ids (B, T) int64 -> logits
    (B, T, vocab_size), computed without a KV cache (`decode_step` decodes with one).

    Packed rows: `position_ids` (B, T) restart at 0 for each example and go to the model with
    no `attention_mask`; transformers then finds the examples from the restarts
    (`masking_utils.find_packed_sequence_indices`) and confines attention to each (sdpa, eager,
    flex and flash-attention alike). `segment_ids` says the same thing (the rows contract
    guarantees that positions restart exactly where segments change) and is not needed here.
    """

    def __init__(self, lm: nn.Module, *, seq_len: int) -> None:
        super().__init__()
        self.lm = lm
        config: Any = lm.config  # a transformers config: attributes per architecture
        self.cfg = LMShape(
            seq_len=seq_len,
            vocab_size=int(config.vocab_size),
            n_layers=int(config.num_hidden_layers),
            d_model=int(config.hidden_size),
        )

    def forward(
        self,
        idx: Tensor,
        position_ids: Tensor | None = None,
        segment_ids: Tensor | None = None,
    ) -> Tensor:
        del segment_ids  # implied by position_ids (see the class doc)
        return self.lm(input_ids=idx, position_ids=position_ids, use_cache=False).logits

    def decode_step(self, idx: Tensor, cache: Any | None) -> tuple[Tensor, Any]:
        """One step of incremental decoding with transformers' KV cache: `idx` (B, T) int64 is
        the whole sequence on the first call (`cache` None), then only the newest token (B, 1)
        with the `cache` the previous call returned. Returns (the last position's logits (B,
        vocab_size), the cache holding every position so far). Not for a sharded (FSDP)
        module, whose forward hooks this bypasses."""
        out = self.lm(input_ids=idx, past_key_values=cache, use_cache=True)
        return out.logits[:, -1], out.past_key_values

    def num_params(self) -> int:
        """Number of parameters (each shared tensor counted once)."""
        return sum(p.numel() for p in self.parameters())


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def build_hf_model(
    spec: ModelSpec,
    *,
    device: torch.device,
    seed: int,
    quantization: BitsAndBytesConfig | None = None,
) -> PreTrainedModel:
    """The causal LM of `spec.hf` on `device`, fp32 (4-bit linear layers with `quantization`,
    which applies to `path_or_id` only: a `from_config` model is quantized by the caller).

    Raises `InvalidJobError` when the model cannot be loaded or built, when its vocabulary is
    smaller than the byte range for byte-level data, or when `spec.seq_len` exceeds its
    position range.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    _quiet_transformers()
    hf = spec.hf
    assert hf is not None  # the spec validator guarantees it for kind 'hf'
    try:
        if hf.from_config is not None:
            options = dict(hf.from_config)
            config = AutoConfig.for_model(options.pop("model_type"), **options)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)  # the same weights on every rank and every attempt
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        else:
            assert hf.path_or_id is not None
            extra: dict[str, Any] = {}
            if quantization is not None:
                extra = {"quantization_config": quantization, "device_map": {"": device}}
            model = AutoModelForCausalLM.from_pretrained(
                hf.path_or_id, revision=hf.revision, dtype=torch.float32, **extra
            )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidJobError(f"model.hf: cannot build the model: {exc}") from exc
    if quantization is None:
        model = model.to(device)
    _check_shape(model.config, spec)
    return model


def _check_shape(config: Any, spec: ModelSpec) -> None:
    positions = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", None
    )
    if positions is not None and spec.seq_len > positions:
        raise InvalidJobError(
            f"model.seq_len ({spec.seq_len}) exceeds the model's {positions} positions"
        )
    tokenizer = load_tokenizer(spec)
    need = len(tokenizer) if tokenizer is not None else VOCAB_SIZE
    if config.vocab_size < need:
        what = "its tokenizer's" if tokenizer is not None else "the byte range of"
        raise InvalidJobError(
            f"the model's vocab_size ({config.vocab_size}) is smaller than {what} {need} ids"
        )


def load_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerBase | None:
    """The tokenizer the data goes through: the model's own (`AutoTokenizer`) for `kind: hf`,
    `tokenizer: auto` and a `path_or_id` that has one; None (bytes) otherwise."""
    hf = spec.hf
    if spec.kind != "hf" or hf is None or hf.path_or_id is None or hf.tokenizer == "bytes":
        return None
    return _tokenizer(hf.path_or_id, hf.revision)


@functools.lru_cache(maxsize=4)
def _tokenizer(path_or_id: str, revision: str | None) -> PreTrainedTokenizerBase | None:
    from transformers import AutoTokenizer

    local = Path(path_or_id)
    if local.is_dir() and not any((local / name).exists() for name in _TOKENIZER_FILES):
        return None
    if not local.is_dir() and (is_uri(path_or_id) or local.exists()):
        return None
    try:
        return AutoTokenizer.from_pretrained(path_or_id, revision=revision)
    except (OSError, ValueError) as exc:  # no tokenizer for this model: bytes
        log.warning("no tokenizer for %s (%s); using bytes", path_or_id, exc)
        return None


def data_vocab_size(tokenizer: PreTrainedTokenizerBase | None) -> int:
    """Ids the data can hold: the tokenizer's, or 256 for bytes."""
    return len(tokenizer) if tokenizer is not None else VOCAB_SIZE
