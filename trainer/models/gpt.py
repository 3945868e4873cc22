"""A GPT-style decoder-only transformer over bytes (Radford et al. 2019, as in nanoGPT).

Pre-LayerNorm blocks, causal self-attention through `F.scaled_dot_product_attention`, a GELU
MLP, a learned positional embedding, and (by default) an output projection tied to the token
embedding (Press & Wolf 2017). Attention reshapes use `.view(B, T, -1, head_dim)` so the
same code runs with tensor-parallel local head counts.

Packed rows (several examples in one sequence, `trainer.data.rows`): the forward takes optional
`position_ids` (restarting per example, into the positional embedding) and `segment_ids`; with
them attention is causal *and* confined to equal segment ids (a block-diagonal boolean mask,
`block_causal_mask`), so examples never attend to each other. Without them the plain causal
path (`is_causal=True`, no mask tensor) runs unchanged.

The model is built on the meta device and materialized with `init_weights`, which draws
every weight from a generator seeded by the job seed: two builds with one seed are equal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from jobspec.job import ModelSpec

VOCAB_SIZE = 256  # byte-level: token id = byte value
INIT_STD = 0.02


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Shape of the network."""

    vocab_size: int = VOCAB_SIZE  # number of token ids
    n_layers: int  # transformer blocks
    n_heads: int  # attention heads per block; must divide d_model
    d_model: int  # hidden size (channels)
    d_ff: int  # MLP inner size
    seq_len: int  # longest input the positional embedding covers, in tokens
    dropout: float = 0.0  # dropout probability (attention, residual, embedding)
    tie_embeddings: bool = True  # output projection = token embedding transposed

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> GPTConfig:
        return cls(
            n_layers=spec.n_layers,
            n_heads=spec.n_heads,
            d_model=spec.d_model,
            d_ff=spec.d_ff or 4 * spec.d_model,
            seq_len=spec.seq_len,
            dropout=spec.dropout,
        )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@runtime_checkable
class ModelShape(Protocol):
    """What sampling and the MFU estimate read of a model's `cfg`: a `GPTConfig`, or the
    `trainer.models.hf.LMShape` of a Hugging Face model."""

    @property
    def seq_len(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def d_model(self) -> int: ...


def shape_of(model: nn.Module) -> ModelShape:
    """`model.cfg` (GPT or HFCausalLM). Raises `TypeError` for a model without one."""
    cfg = model.cfg
    if not isinstance(cfg, ModelShape):
        raise TypeError(f"{type(model).__name__} has no `cfg` with the model's shape")
    return cfg


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: (B, T, d_model) -> (B, T, d_model)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.dropout = cfg.dropout
        self.wq = nn.Linear(cfg.d_model, cfg.d_model)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """`mask`: (B, 1, T, T) bool, True where query t may attend to key s (already causal);
        None: plain causal attention."""
        B, T, _ = x.shape
        # (B, T, C) -> (B, H, T, head_dim); H is the local head count under tensor parallel
        q = self.wq(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=mask is None,
        )
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.resid_dropout(self.wo(y))


class MLP(nn.Module):
    """Position-wise feed-forward: d_model -> d_ff -> GELU -> d_model."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.proj = nn.Linear(cfg.d_ff, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


def block_causal_mask(segment_ids: Tensor) -> Tensor:
    """Attention mask of packed rows: segment ids (B, T) int64 -> (B, 1, T, T) bool, True
    where query t may attend to key s: s <= t and both in the same segment (the
    block-diagonal causal mask of packed sequences; the diagonal is always True, so no query
    row is empty, also for padding's segment -1). Broadcasts over heads."""
    length = segment_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment_ids.device).tril()
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (same & causal).unsqueeze(1)


class GPT(nn.Module):
    """Token ids (B, T) int64, T <= seq_len -> logits (B, T, vocab_size).

    Optional `position_ids` (B, T) int64 (< seq_len) replace 0..T-1 in the positional
    embedding; optional `segment_ids` (B, T) int64 confine attention to each segment
    (`block_causal_mask`). Both None: plain causal attention over positions 0..T-1.
    Raises `ValueError` when T exceeds seq_len.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        # A dict keyed "0", "1", ...: the parameter names are those of a list, and a pipeline
        # stage that keeps only some blocks keeps their names (checkpoints reshard by name).
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.ln_f = nn.LayerNorm(cfg.d_model)
        # Tied: logits use wte.weight directly, so no second module shares a Parameter
        # (shared Parameters break on to_empty and complicate sharding).
        self.lm_head = (
            None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        )

    def forward(
        self,
        idx: Tensor,
        position_ids: Tensor | None = None,
        segment_ids: Tensor | None = None,
    ) -> Tensor:
        length = idx.shape[1]
        if length > self.cfg.seq_len:
            raise ValueError(f"sequence of {length} tokens exceeds seq_len {self.cfg.seq_len}")
        pos = torch.arange(length, device=idx.device) if position_ids is None else position_ids
        x = self.drop(self.wte(idx) + self.wpe(pos))
        mask = None if segment_ids is None else block_causal_mask(segment_ids)
        for block in self.blocks.values():
            x = block(x, mask)
        x = self.ln_f(x)
        if self.lm_head is None:
            return F.linear(x, self.wte.weight)
        return self.lm_head(x)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Draw all weights from a generator seeded with `seed` (GPT-2 scheme).

        Linear and embedding weights ~ N(0, 0.02); residual output projections (`wo`,
        `proj`) ~ N(0, 0.02 / sqrt(2 n_layers)); biases 0; LayerNorm weight 1, bias 0.
        """
        device = self.wte.weight.device
        gen = torch.Generator(device=device).manual_seed(seed)
        resid_std = INIT_STD / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = resid_std if name.endswith(("attn.wo", "mlp.proj")) else INIT_STD
                nn.init.normal_(module.weight, mean=0.0, std=std, generator=gen)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD, generator=gen)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        """Number of parameters (each shared tensor counted once)."""
        return sum(p.numel() for p in self.parameters())


def build_model(cfg: GPTConfig, *, device: torch.device, seed: int) -> GPT:
    """Build on the meta device, allocate on `device`, initialize from `seed`."""
    with torch.device("meta"):
        model = GPT(cfg)
    model.to_empty(device=device)
    model.init_weights(seed)
    return model


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt_ids: Tensor,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
    *,
    vocab_size: int | None = None,
    top_k: int | None = None,
    stop: Callable[[Tensor], bool] | None = None,
) -> Tensor:
    """Sample a continuation of `prompt_ids` (T0,) int64, T0 >= 1; returns (T,), T <=
    `max_new_tokens`.

    Ancestral sampling from softmax(logits / temperature) (greedy, the argmax, at temperature
    0), among the `top_k` most likely ids when given (Fan et al. 2018), the context cropped to
    the last `model.cfg.seq_len` tokens; with `vocab_size`, only among ids below it (a model
    whose vocabulary is larger than the data's). `stop` sees the ids generated so far after
    each token and ends the answer when it returns True. `generator` must live on the model's
    device. Raises `ValueError` for an empty prompt.
    """
    if prompt_ids.numel() == 0:
        raise ValueError("generate needs a prompt of at least one token")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = prompt_ids.to(device=device, dtype=torch.long).view(1, -1)
    start = ids.shape[1]
    for _ in range(max_new_tokens):
        logits = model(ids[:, -shape_of(model).seq_len :])[:, -1, :vocab_size].float()
        if temperature == 0:
            next_id = logits.argmax(dim=-1, keepdim=True)
        else:
            if top_k is not None and top_k < logits.shape[-1]:
                kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits / temperature, dim=-1)
            next_id = torch.multinomial(probs, num_samples=1, generator=generator)
        ids = torch.cat([ids, next_id], dim=1)
        if stop is not None and stop(ids[0, start:]):
            break
    model.train(was_training)
    return ids[0, start:]
