"""GRPO training: sample a group of completions per prompt from the current policy, grade them,
and take the clipped policy-gradient step on their group-normalised advantages
(`trainer.methods.grpo` holds the arithmetic and its sources).

One optimizer step, on each rank: the step's prompts (`Prompts`, this rank's share of the
sampler's global batch) each get `group_size` completions, sampled without gradient from the
policy in eval mode (`sample_group`; ancestral sampling with temperature, top-k and top-p, the
generator seeded by (seed, step, rank) so a resumed run samples what the uninterrupted one
did). Each completion's text is graded against its prompt's record (`Grader.grade(sample,
item)`: the spec's graders, scored in this process, which runs inside the job's sandbox); the
graders' weighted sum is its reward, and a group's rewards give its advantages. Then one
forward and backward per group (a group shares its prompt, so its G rows need no padding), the
loss normalised by the step's global completions and completion tokens (all-reduced before the
first backward), gradients reduced on the last group only.

The reference of the KL term (`beta` > 0) is `trainer.methods.dpo_train.Reference`: the policy
with its adapters disabled under LoRA, else a frozen copy of the starting weights.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from trainer.distributed import DistInfo, all_reduce_sum, no_sync
from trainer.methods.base import autocast
from trainer.methods.dpo_train import Reference
from trainer.methods.grpo import (
    STATISTICS,
    LossType,
    Normalisers,
    ScaleRewards,
    aggregate,
    combine_rewards,
    group_advantages,
    loss_statistics,
    per_token_loss,
    token_entropy,
    token_logps,
)
from trainer.parallel.parallelize import set_gradient_sync

if TYPE_CHECKING:
    from trainer.loop import Run


class Grader(Protocol):
    """What GRPO needs of a grader (`trainer.graders`): its name and a score per sample."""

    name: str

    def grade(self, sample: dict[str, Any], item: dict[str, Any]) -> float:
        """The score of `sample` (`output_text`: the completion's text) for the dataset record
        `item`; NaN when it cannot be scored."""
        ...


@dataclass(frozen=True)
class Prompts:
    """N prompts: each one's token ids (1-D int64, what the model continues: the chat
    template's generation prompt included) and its dataset record (what graders read as
    `item`)."""

    ids: Sequence[np.ndarray]
    records: Sequence[dict[str, Any]]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.records):
            raise ValueError(f"{len(self.ids)} prompts but {len(self.records)} records")

    def __len__(self) -> int:
        return len(self.ids)


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


@dataclass
class Group:
    """One prompt's sampled completions, graded."""

    prompt_ids: Tensor  # (T0,)
    completion_ids: Tensor  # (G, C)
    mask: Tensor  # (G, C)
    texts: list[str]
    rewards: Tensor  # (G, K) per grader, NaN where unscored
    advantages: Tensor | None = None  # (G,)


@dataclass
class GRPOMethod:
    """GRPO as the loop's `trainer.methods.base.Method`. `run.train_rows` / `run.eval_rows`
    are not read: the prompts are `prompts` (train, eval)."""

    prompts: tuple[Prompts, Prompts]
    graders: Sequence[Grader]
    sampling: Sampling
    decode: Callable[[list[int]], str]  # completion ids (stop id excluded) -> text
    weights: Sequence[float] | None = None  # per grader; ones when None
    loss_type: LossType = "dapo"
    scale_rewards: ScaleRewards = "group"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    beta: float = 0.0
    reference: Reference | None = None
    precision: str = "fp32"
    seed: int = 0
    _sums: Tensor | None = field(default=None, repr=False)
    last_samples: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def accumulate(self, run: Run) -> Tensor:
        """`Method.accumulate`: sample, grade, and the step's forward/backward over this
        rank's prompts; returns this rank's share of the step's loss (0-dim fp32)."""
        indices = np.concatenate(run.sampler.split(run.sampler.next_global_batch()))
        global_prompts = run.sampler.global_batch_size
        generator = self._generator(run.dist.device, run.state.step, run.dist.rank)
        groups = self.sample(run.model, self.prompts[0], indices, run.dist.device, generator)
        return self.accumulate_groups(
            groups,
            model=run.model,
            train_model=run.parallel_model,
            global_prompts=global_prompts,
            dp_size=run.dims.dp_size,
            dist=run.dist,
            scaler=run.scaler,
        )

    def _generator(self, device: torch.device, step: int, rank: int) -> torch.Generator:
        seed = (self.seed * 1_000_003 + step) * 4099 + rank
        return torch.Generator(device=device).manual_seed(seed % (2**63))

    def sample(
        self,
        model: nn.Module,
        prompts: Prompts,
        indices: np.ndarray,
        device: torch.device,
        generator: torch.Generator,
    ) -> list[Group]:
        """Sample and grade a group for each prompt at `indices`."""
        groups = []
        for index in indices.tolist():
            prompt = torch.as_tensor(np.asarray(prompts.ids[index]), dtype=torch.long)
            prompt = prompt.to(device)
            with autocast(device, self.precision):
                ids, mask = sample_group(model, prompt, self.sampling, generator)
            texts = [
                self.decode(row[: int(m.sum())].tolist()) for row, m in zip(ids, mask, strict=True)
            ]
            item = prompts.records[index]
            scores = [
                [_score(grader, {"output_text": text}, item) for grader in self.graders]
                for text in texts
            ]
            groups.append(
                Group(prompt, ids, mask, texts, torch.tensor(scores, dtype=torch.float32))
            )
        return groups

    def accumulate_groups(
        self,
        groups: Sequence[Group],
        *,
        model: nn.Module,
        train_model: nn.Module,
        global_prompts: int,
        dp_size: int,
        dist: DistInfo,
        scaler: torch.amp.GradScaler | None = None,
    ) -> Tensor:
        """Advantages, then one forward and backward per group; gradients reduced on the last.

        `model`: the policy (sharded or plain); `train_model`: what a training forward calls
        (DDP(model) or model). The loss is divided by the global normalisers (all-reduced
        here) and multiplied by `dp_size`, which the data-parallel gradient average divides
        again, so the step's gradient is that of the global loss. Returns this rank's share
        of it (0-dim fp32, detached)."""
        device = groups[0].prompt_ids.device
        self._advantages(groups, dist)
        tokens = sum(int(g.mask.sum()) for g in groups)
        total_tokens = int(all_reduce_sum(torch.tensor(float(tokens), device=device), dist))
        norm = Normalisers(
            completions=global_prompts * self.sampling.group_size,
            tokens=total_tokens,
            max_completion_length=self.sampling.max_new_tokens,
        )
        loss_sum = torch.zeros((), device=device)
        sums = torch.zeros(len(STATISTICS) + 1, dtype=torch.float64, device=device)
        for g, group in enumerate(groups):
            last = g == len(groups) - 1
            set_gradient_sync(model, last)
            ids = torch.cat(
                [group.prompt_ids.expand(len(group.texts), -1), group.completion_ids], 1
            )
            start = group.prompt_ids.numel() - 1
            targets = group.completion_ids
            ref = self._reference_logps(ids, start, targets)
            with no_sync(train_model, skip_sync=not last):
                with autocast(device, self.precision):
                    logits = train_model(ids)[:, start:-1]
                logps = token_logps(logits, targets)
                assert group.advantages is not None
                loss, ratio, kl = per_token_loss(
                    logps,
                    logps.detach(),  # num_iterations 1: the sampling policy is this one
                    group.advantages,
                    epsilon_low=self.epsilon_low,
                    epsilon_high=self.epsilon_high,
                    ref_logps=ref,
                    beta=self.beta,
                )
                share = aggregate(loss, group.mask, self.loss_type, norm)
                scaled = share * dp_size
                (scaler.scale(scaled) if scaler else scaled).backward()
            loss_sum += share.detach().float()
            stats = loss_statistics(
                ratio.detach(),
                group.advantages,
                group.mask,
                epsilon_low=self.epsilon_low,
                epsilon_high=self.epsilon_high,
                kl=None if kl is None else kl.detach(),
            )
            entropy = (token_entropy(logits) * group.mask).sum().double()
            sums += torch.cat([stats, entropy.view(1).to(stats)])
        self._remember(groups, sums, device)
        return loss_sum

    def _advantages(self, groups: Sequence[Group], dist: DistInfo) -> None:
        weights = None if self.weights is None else torch.tensor(list(self.weights))
        for group in groups:
            rewards = combine_rewards(group.rewards, weights)
            if self.scale_rewards == "batch":
                group.advantages = rewards  # centred and scaled below, over every rank
            else:
                group.advantages = group_advantages(rewards, len(group.texts), self.scale_rewards)[
                    0
                ]
        if self.scale_rewards == "batch":
            self._batch_scale(groups, dist)

    def _batch_scale(self, groups: Sequence[Group], dist: DistInfo) -> None:
        """`scale_rewards: batch`: each group centred on its mean, divided by the std of every
        reward of the step (all ranks; Bessel-corrected, NaN left out)."""
        device = groups[0].prompt_ids.device
        rewards = torch.cat([g.advantages for g in groups if g.advantages is not None])
        valid = rewards[~torch.isnan(rewards)].double()
        moments = torch.stack(
            [valid.new_tensor(float(valid.numel())), valid.sum(), (valid**2).sum()]
        )
        count, total, squares = all_reduce_sum(moments.to(device), dist).tolist()
        variance = (squares - total * total / count) / (count - 1) if count > 1 else 0.0
        std = math.sqrt(max(variance, 0.0))
        for group in groups:
            assert group.advantages is not None
            centred = group_advantages(group.advantages, len(group.texts), "none")[0]
            group.advantages = centred / (std + 1e-4)

    def _reference_logps(self, ids: Tensor, start: int, targets: Tensor) -> Tensor | None:
        if self.beta == 0.0 or self.reference is None:
            return None
        reference = self.reference
        with torch.no_grad():
            adapters_off = (
                reference.peft_model.disable_adapter()
                if reference.peft_model is not None
                else contextlib.nullcontext()
            )
            was_training = reference.model.training
            reference.model.eval()
            try:
                with adapters_off, autocast(ids.device, self.precision):
                    logits = reference.model(ids)[:, start:-1]
            finally:
                reference.model.train(was_training)
            return token_logps(logits, targets)

    def _remember(self, groups: Sequence[Group], sums: Tensor, device: torch.device) -> None:
        rewards = torch.cat([combine_rewards(g.rewards, _tensor(self.weights)) for g in groups])
        per_grader = torch.cat([g.rewards for g in groups])
        zero_std = sum(
            int(
                group_advantages(combine_rewards(g.rewards, _tensor(self.weights)), len(g.texts))[
                    1
                ].all()
            )
            for g in groups
        )
        lengths = torch.cat([g.mask.sum(1) for g in groups]).double()
        valid = ~torch.isnan(rewards)
        extra = [
            rewards[valid].double().sum(),
            (rewards[valid].double() ** 2).sum(),
            valid.sum().double(),
            torch.tensor(float(zero_std), dtype=torch.float64),
            torch.tensor(float(len(groups)), dtype=torch.float64),
            lengths.sum(),
            torch.tensor(float(lengths.numel()), dtype=torch.float64),
        ]
        for k in range(per_grader.shape[1]):
            column = per_grader[:, k]
            ok = ~torch.isnan(column)
            extra += [column[ok].double().sum(), ok.sum().double()]
        self._sums = torch.cat([sums, torch.stack([e.to(sums) for e in extra])]).to(device)
        group = groups[0]
        self.last_samples = [
            {"completion": text, "reward": float(r)}
            for text, r in zip(
                group.texts, combine_rewards(group.rewards, _tensor(self.weights)), strict=True
            )
        ]

    def train_metrics(self, run: Run) -> dict[str, float]:
        """`Method.train_metrics`: the last step's metrics over every rank (a collective)."""
        return self.step_metrics(run.dist)

    def step_metrics(self, dist: DistInfo) -> dict[str, float]:
        """All ranks: the last step's `reward`, `reward_std`, `reward/<grader>`,
        `frac_reward_zero_std`, `completion_length` (tokens), `kl`, `clip_ratio/*`,
        `entropy` (nats per completion token)."""
        if self._sums is None:
            raise RuntimeError("no GRPO step has run yet")
        s = all_reduce_sum(self._sums.clone(), dist).tolist()
        kl, low, high, region, tokens, entropy = s[:6]
        total, squares, count, zero_std, groups, lengths, completions = s[6:13]
        metrics = {
            "reward": total / max(count, 1),
            "reward_std": math.sqrt(max(squares - total * total / count, 0.0) / (count - 1))
            if count > 1
            else 0.0,
            "frac_reward_zero_std": zero_std / max(groups, 1),
            "completion_length": lengths / max(completions, 1),
            "clip_ratio/low": low / max(tokens, 1),
            "clip_ratio/high": high / max(tokens, 1),
            "clip_ratio/region": region / max(tokens, 1),
            "entropy": entropy / max(tokens, 1),
        }
        if self.beta:
            metrics["kl"] = kl / max(tokens, 1)
        for k, grader in enumerate(self.graders):
            score, scored = s[13 + 2 * k], s[14 + 2 * k]
            metrics[f"reward/{grader.name}"] = score / scored if scored else float("nan")
        return metrics

    @torch.no_grad()
    def evaluate(self, run: Run) -> dict[str, float]:
        """`Method.evaluate`: the mean reward of greedy completions of every rank's held-out
        prompts (`eval_reward`; also `eval_loss` = -eval_reward, the number the loop checks)."""
        prompts = self.prompts[1]
        indices = np.concatenate(run.eval_batches) if run.eval_batches else np.zeros(0, dtype=int)
        return self.evaluate_prompts(run.model, prompts, indices, run.dist)

    def evaluate_prompts(
        self, model: nn.Module, prompts: Prompts, indices: np.ndarray, dist: DistInfo
    ) -> dict[str, float]:
        """All ranks: `eval_reward` (mean over the prompts at `indices` of every rank) of one
        greedy completion each, and `eval_loss` = -eval_reward."""
        greedy = Sampling(
            group_size=1,
            max_new_tokens=self.sampling.max_new_tokens,
            temperature=0.0,
            stop_ids=self.sampling.stop_ids,
            vocab_size=self.sampling.vocab_size,
            collective=self.sampling.collective,
        )
        device = dist.device
        generator = torch.Generator(device=device).manual_seed(self.seed)
        method = GRPOMethod(
            prompts=self.prompts,
            graders=self.graders,
            sampling=greedy,
            decode=self.decode,
            weights=self.weights,
            precision=self.precision,
        )
        groups = method.sample(model, prompts, indices, device, generator)
        rewards = torch.cat([combine_rewards(g.rewards, _tensor(self.weights)) for g in groups])
        valid = rewards[~torch.isnan(rewards)].double()
        total, count = all_reduce_sum(
            torch.stack([valid.sum(), valid.new_tensor(float(valid.numel()))]).to(device), dist
        ).tolist()
        reward = total / count if count else float("nan")
        return {"eval_reward": reward, "eval_loss": -reward}

    def baseline_eval_loss(self, run: Run) -> float | None:
        """None: a reward has no model-free reference."""
        return None


def _score(grader: Grader, sample: dict[str, Any], item: dict[str, Any]) -> float:
    score = grader.grade(sample, item)
    return float(score) if score is not None else float("nan")


def _tensor(weights: Sequence[float] | None) -> Tensor | None:
    return None if weights is None else torch.tensor(list(weights), dtype=torch.float32)
