"""Rollouts: completions sampled from a policy for GRPO (`trainer.methods.grpo_train`), a
group of them per prompt, graded, and kept as the generation batch (`Rollout`) that the
`num_iterations` optimizer steps after it train on.

A group is batched over its completions (they share the prompt, so its rows need no padding),
sampled without a KV cache (each new token runs the model over the whole sequence: short
completions of small models, as the trainer's own sample does). When the forward is a
collective (FSDP: parameters are all-gathered in every forward), every rank makes the same
number of forwards: a rank whose group is done keeps calling the model, without sampling,
until every rank's group is (`sample_group`'s `all_done`), so what each rank samples is what
it would sample alone."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from trainer.data.prompts import Prompts
from trainer.methods.base import autocast

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Sampling:
    """How completions are sampled: `group_size` per prompt, up to `max_new_tokens` tokens
    each, ending at the first of `stop_ids` (included in the completion); softmax of logits /
    `temperature` (0: greedy) restricted to the `top_k` most likely ids and the smallest set
    whose probability reaches `top_p` (nucleus sampling, Holtzman et al. 2020); ids >=
    `vocab_size` never."""

    group_size: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop_ids: tuple[int, ...] = ()
    vocab_size: int | None = None


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


AllDone = Callable[[bool], bool]  # this rank's group is done -> every rank's is (a collective)


@torch.no_grad()
def sample_group(
    model: nn.Module,
    prompt_ids: Tensor,
    sampling: Sampling,
    generator: torch.Generator,
    *,
    all_done: AllDone | None = None,
) -> tuple[Tensor, Tensor]:
    """`sampling.group_size` completions of one prompt `prompt_ids` (T0,) int64.

    Returns (ids (G, C) int64, mask (G, C) int64), C <= `max_new_tokens`: a completion's mask
    is 1 up to and including its first stop id, 0 after (its ids there are the stop id
    repeated). In eval mode; `generator` lives on the model's device. A model with a
    `decode_step(ids, cache)` (`trainer.models.hf.HFCausalLM`: transformers' KV cache) is
    given only the newest token after the first step; any other, and every model under FSDP,
    is called on the whole sequence each step. `all_done` (a collective forward, FSDP): asked
    before each forward whether every rank's group is done; until it is, a rank whose group
    is done still calls the model but samples nothing (its ids and `generator` stay as they
    would be alone). Raises `ValueError` for an empty prompt."""
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
    decode_step = _decode_step(model) if all_done is None else None
    cache: Any = None
    try:
        for _ in range(sampling.max_new_tokens):
            finished = bool(done.all())
            if all_done is None and finished:
                break
            if all_done is not None and all_done(finished):
                break
            if decode_step is not None:
                last, cache = decode_step(ids if cache is None else ids[:, -1:], cache)
                logits = last[:, : sampling.vocab_size].float()
            else:
                logits = model(ids)[:, -1, : sampling.vocab_size].float()
            if finished:  # only the other ranks' groups need this forward
                continue
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
    finally:
        model.train(was_training)
    return ids[:, start:], torch.stack(mask_columns, dim=1)


def _decode_step(model: nn.Module) -> Callable[[Tensor, Any], tuple[Tensor, Any]] | None:
    """`model.decode_step` when it decodes with a KV cache and is not sharded by FSDP (whose
    hooks run on `forward` only), else None."""
    from torch.distributed.fsdp import FSDPModule

    step = getattr(model, "decode_step", None)
    if step is None or any(isinstance(m, FSDPModule) for m in model.modules()):
        return None
    return step


class Grader(Protocol):
    """What GRPO needs of a grader (`trainer.graders`): its name and a score per sample."""

    name: str

    def grade(self, sample: dict[str, Any], item: dict[str, Any]) -> float:
        """The score of `sample` (`output_text`: the completion's text) for the dataset record
        `item`; NaN when it cannot be scored."""
        ...


@dataclass
class Group:
    """One prompt's sampled completions, graded; what the steps of its rollout train on."""

    prompt_ids: Tensor  # (T0,) int64
    completion_ids: Tensor  # (G, C) int64
    mask: Tensor  # (G, C) int64
    texts: list[str]
    rewards: Tensor  # (G, K) fp32 per grader, NaN where unscored
    advantages: Tensor | None = None  # (G,) fp32
    reward: Tensor | None = None  # (G,) fp32, the graders' weighted sum, NaN where none scored
    zero_std: bool = False  # every completion scored alike: the group teaches nothing
    # (G, C) fp32 log-probabilities (nats) of the completion tokens under the policy that
    # sampled them (num_iterations > 1; None: the ratio's denominator is the current policy,
    # detached) and under the reference (beta > 0), computed once after sampling.
    old_logps: Tensor | None = None
    ref_logps: Tensor | None = None

    @property
    def ids(self) -> Tensor:
        """(G, T0 + C) int64: the prompt followed by each completion."""
        return torch.cat([self.prompt_ids.expand(len(self.texts), -1), self.completion_ids], 1)


def completion_codec(
    tokenizer: PreTrainedTokenizerBase | None,
) -> tuple[tuple[int, ...], Callable[[list[int]], str]]:
    """(stop ids, decode) of a model's completions: its tokenizer's end-of-sequence token and
    its decoding without special tokens; for the byte-level model (no tokenizer), no stop id
    and UTF-8 (an invalid byte replaced)."""
    if tokenizer is None:
        return (), lambda ids: bytes(ids).decode("utf-8", errors="replace")
    stop = tuple(int(i) for i in {tokenizer.eos_token_id} if i is not None)
    return stop, lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True))


def sample_groups(
    model: nn.Module,
    prompts: Prompts,
    indices: np.ndarray,
    *,
    sampling: Sampling,
    graders: Sequence[Grader],
    decode: Callable[[list[int]], str],
    device: torch.device,
    generator: torch.Generator,
    precision: str = "fp32",
    all_done: AllDone | None = None,
) -> list[Group]:
    """Sample (`sample_group`) and grade a group for each prompt at `indices` (N,), in order.
    Each completion's ids (its stop id excluded) are decoded to the text the graders score
    against the prompt's record; a grader's None is NaN (unscored)."""
    groups = []
    for index in indices.tolist():
        prompt = torch.as_tensor(np.asarray(prompts.ids[index]), dtype=torch.long).to(device)
        with autocast(device, precision):
            ids, mask = sample_group(model, prompt, sampling, generator, all_done=all_done)
        texts = [decode(row[: int(m.sum())].tolist()) for row, m in zip(ids, mask, strict=True)]
        item = prompts.records[index]
        scores = [[_score(g, {"output_text": text}, item) for g in graders] for text in texts]
        groups.append(Group(prompt, ids, mask, texts, torch.tensor(scores, dtype=torch.float32)))
    return groups


def _score(grader: Grader, sample: dict[str, Any], item: dict[str, Any]) -> float:
    score = grader.grade(sample, item)
    return float(score) if score is not None else float("nan")


@dataclass
class Rollout:
    """A generation batch: the groups sampled before optimizer step `step` + 1 (`step` steps
    done), of `global_prompts` prompts over all ranks; the steps `step` + 1 ...
    `step` + num_iterations train on it. Saved in each rank's checkpoint state (`to_bytes`),
    so a run resumed inside an iteration cycle trains on what the uninterrupted one did."""

    step: int
    global_prompts: int
    groups: list[Group]

    def to_bytes(self) -> bytes:
        """`torch.save` of plain dicts, lists and tensors (loadable with weights_only)."""
        groups = [{f.name: getattr(g, f.name) for f in fields(Group)} for g in self.groups]
        buffer = io.BytesIO()
        torch.save(
            {"step": self.step, "global_prompts": self.global_prompts, "groups": groups}, buffer
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, device: torch.device) -> Rollout:
        """The rollout `to_bytes` wrote, its tensors on `device`."""
        raw = torch.load(io.BytesIO(data), map_location=device, weights_only=True)
        return cls(
            step=int(raw["step"]),
            global_prompts=int(raw["global_prompts"]),
            groups=[Group(**g) for g in raw["groups"]],
        )
