"""Rollouts: completions sampled from a policy for GRPO (`trainer.methods.grpo_train`), a
group of them per prompt, batched over the group (a group shares its prompt, so its rows need no
padding), without a KV cache (each new token runs the model over the whole sequence: short
completions of small models, as the trainer's own sample does)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Sampling:
    """How completions are sampled: `group_size` per prompt, up to `max_new_tokens` tokens
    each, ending at the first of `stop_ids` (included in the completion); softmax of logits /
    `temperature` restricted to the `top_k` most likely ids and the smallest set whose
    probability reaches `top_p` (nucleus sampling, Holtzman et al. 2020); ids >= `vocab_size`
    never. `collective`: the forward is a collective (FSDP), so no rank may stop before the
    others: every rank runs all `max_new_tokens` forwards."""

    group_size: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop_ids: tuple[int, ...] = ()
    vocab_size: int | None = None
    collective: bool = False


def filter_logits(logits: Tensor, *, top_k: int | None, top_p: float) -> Tensor:
    """`logits` (B, V) with every id outside the top-k and the top-p nucleus set to -inf (the
    most likely id always stays)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(ordered, dim=-1) >= top_p  # mass before it >= top_p
        drop[:, 0] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


@torch.no_grad()
def sample_group(
    model: nn.Module, prompt_ids: Tensor, sampling: Sampling, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """`sampling.group_size` completions of one prompt `prompt_ids` (T0,) int64.

    Returns (ids (G, C) int64, mask (G, C) int64), C <= `max_new_tokens`: a completion's mask
    is 1 up to and including its first stop id, 0 after (its ids there are the stop id
    repeated). The model is called on the whole sequence each step (no KV cache) in eval mode;
    `generator` lives on the model's device. Raises `ValueError` for an empty prompt."""
    if prompt_ids.numel() == 0:
        raise ValueError("a prompt needs at least one token")
    was_training = model.training
    model.eval()
    device = prompt_ids.device
    ids = prompt_ids.view(1, -1).expand(sampling.group_size, -1).clone()
    start = ids.shape[1]
    done = torch.zeros(sampling.group_size, dtype=torch.bool, device=device)
    mask_columns: list[Tensor] = []
    stop = torch.tensor(sampling.stop_ids or [-1], device=device)
    try:
        for _ in range(sampling.max_new_tokens):
            logits = model(ids)[:, -1, : sampling.vocab_size].float()
            if sampling.temperature == 0:
                next_ids = logits.argmax(dim=-1)
            else:
                logits = filter_logits(
                    logits / sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
                )
                next_ids = torch.multinomial(
                    torch.softmax(logits, dim=-1), 1, generator=generator
                ).squeeze(-1)
            filler = stop[0] if sampling.stop_ids else torch.zeros_like(next_ids)
            next_ids = torch.where(done, filler, next_ids)
            mask_columns.append((~done).long())
            done = done | torch.isin(next_ids, stop)
            ids = torch.cat([ids, next_ids[:, None]], dim=1)
            if bool(done.all()) and not sampling.collective:
                break
    finally:
        model.train(was_training)
    return ids[:, start:], torch.stack(mask_columns, dim=1)
