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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from trainer.data.prompts import Prompts
from trainer.distributed import DistInfo, all_reduce_sum, no_sync
from trainer.methods.base import autocast
from trainer.methods.dpo_train import Reference, starting_weights
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
from trainer.methods.rollouts import Sampling, sample_group
from trainer.parallel.parallelize import set_gradient_sync

# A `sample` event's group: this many completions, each cut to this many characters (the
# prompt to its last ones).
MAX_SAMPLES = 8
SAMPLE_CHARS = 500

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from jobspec.job import JobSpec
    from trainer.loop import Run
    from trainer.models.network import Network


class Grader(Protocol):
    """What GRPO needs of a grader (`trainer.graders`): its name and a score per sample."""

    name: str

    def grade(self, sample: dict[str, Any], item: dict[str, Any]) -> float:
        """The score of `sample` (`output_text`: the completion's text) for the dataset record
        `item`; NaN when it cannot be scored."""
        ...


@dataclass
class Group:
    """One prompt's sampled completions, graded."""

    prompt_ids: Tensor  # (T0,)
    completion_ids: Tensor  # (G, C)
    mask: Tensor  # (G, C)
    texts: list[str]
    rewards: Tensor  # (G, K) per grader, NaN where unscored
    advantages: Tensor | None = None  # (G,)
    reward: Tensor | None = None  # (G,) the graders' weighted sum, NaN where none scored
    zero_std: bool = False  # every completion scored alike: the group teaches nothing


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
    closers: Sequence[Callable[[], None]] = ()  # the graders' (their child processes)
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
            group.reward = rewards
            group.zero_std = bool(group_advantages(rewards, len(group.texts))[1].all())
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
        rewards = torch.cat([g.reward for g in groups if g.reward is not None])
        per_grader = torch.cat([g.rewards for g in groups])
        zero_std = sum(int(g.zero_std) for g in groups)
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
        for grader in self.graders:  # cumulative on this rank: `trainer.graders` counts them
            for counter in ("errors", "timeouts"):
                extra.append(torch.tensor(float(getattr(grader, counter, 0)), dtype=torch.float64))
        self._sums = torch.cat([sums, torch.stack([e.to(sums) for e in extra])]).to(device)
        group = groups[0]
        prompt = self.decode(group.prompt_ids.tolist())
        assert group.reward is not None  # set by `_advantages`
        scored = group.reward.tolist()
        self.last_samples = [
            {"prompt": prompt[-SAMPLE_CHARS:], "completion": text[:SAMPLE_CHARS], "reward": r}
            for text, r in zip(group.texts, scored, strict=True)
        ][:MAX_SAMPLES]

    def train_metrics(self, run: Run) -> dict[str, float]:
        """`Method.train_metrics`: the last step's metrics over every rank (a collective). The
        reporting rank also reports the step's first group as a `sample` event: its prompt, one
        completion as `text`, and `samples` (each completion with its reward; the job page
        shows them)."""
        if self.last_samples:
            first = self.last_samples[0]
            run.reporter.emit(
                "sample",
                step=run.state.step,
                prompt=first["prompt"],
                text=first["completion"],
                samples=self.last_samples,
            )
        return self.step_metrics(run.dist)

    def step_metrics(self, dist: DistInfo) -> dict[str, float]:
        """All ranks: the last step's `reward`, `reward_std`, `reward/<grader>`,
        `frac_reward_zero_std`, `completion_length` (tokens), `kl`, `clip_ratio/*`,
        `entropy` (nats per completion token), and since the start of this attempt over all
        ranks `grader_errors/<grader>` (exceptions, non-numbers, exits: each scored 0) and
        `grader_timeouts/<grader>` (calls stopped at the grader's `timeout_s`)."""
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
        counts = 13 + 2 * len(self.graders)
        for k, grader in enumerate(self.graders):
            score, scored = s[13 + 2 * k], s[14 + 2 * k]
            metrics[f"reward/{grader.name}"] = score / scored if scored else float("nan")
            metrics[f"grader_errors/{grader.name}"] = s[counts + 2 * k]
            metrics[f"grader_timeouts/{grader.name}"] = s[counts + 2 * k + 1]
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

    def close(self) -> None:
        """Stop what the graders run (a python grader's child process)."""
        for close in self.closers:
            close()


def build_grpo(
    spec: JobSpec,
    network: Network,
    model: nn.Module,
    *,
    dist_info: DistInfo,
    mesh: DeviceMesh | None,
    prompts: tuple[Prompts, Prompts],
    init_from: str | None = None,
    code_dir: Path | None = None,
) -> GRPOMethod:
    """The GRPO method of a `method.kind: grpo` job over `prompts` (train, eval): its graders
    built (`trainer.graders`; a python grader's `file` is read from `code_dir`), completions
    decoded with the model's tokenizer (bytes without one) and ended at its end-of-sequence
    token, the reference built when `beta` > 0 (`starting_weights`).

    Raises `InvalidJobError` when a grader cannot be built (`trainer.graders.GraderError`) or
    the reference cannot (as `build_network`)."""
    from trainer.graders import build_graders

    grpo = spec.method.grpo
    if grpo is None:
        raise ValueError("not a GRPO job (method.kind is not 'grpo')")
    tokenizer = network.tokenizer
    if tokenizer is not None:
        stop = tuple(int(i) for i in {tokenizer.eos_token_id} if i is not None)

        def decode(ids: list[int]) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=True))

    else:
        stop = ()

        def decode(ids: list[int]) -> str:
            return bytes(ids).decode("utf-8", errors="replace")

    reference = None
    if grpo.beta > 0:
        reference = starting_weights(
            spec, network, model, dist_info=dist_info, mesh=mesh, init_from=init_from
        )
    graders = build_graders(grpo.graders, code_dir)
    return GRPOMethod(
        prompts=prompts,
        graders=graders,
        sampling=Sampling(
            group_size=grpo.group_size,
            max_new_tokens=grpo.max_new_tokens,
            temperature=grpo.temperature,
            top_p=grpo.top_p,
            top_k=grpo.top_k,
            stop_ids=stop,
            vocab_size=network.vocab_size,
        ),
        decode=decode,
        weights=[g.weight for g in graders],
        loss_type=grpo.loss_type,
        scale_rewards=grpo.scale_rewards,
        epsilon_low=grpo.epsilon,
        epsilon_high=grpo.epsilon if grpo.epsilon_high is None else grpo.epsilon_high,
        beta=grpo.beta,
        reference=reference,
        precision=spec.train.precision,
        seed=spec.seed,
        closers=[g.close for g in graders],
    )


def _score(grader: Grader, sample: dict[str, Any], item: dict[str, Any]) -> float:
    score = grader.grade(sample, item)
    return float(score) if score is not None else float("nan")


def _tensor(weights: Sequence[float] | None) -> Tensor | None:
    return None if weights is None else torch.tensor(list(weights), dtype=torch.float32)
