"""GRPO training: sample a group of completions per prompt from the current policy, grade them,
and take the clipped policy-gradient step on their group-normalised advantages
(`trainer.methods.grpo` holds the arithmetic and its sources).

Generation, on each rank, before every `num_iterations`-th optimizer step (steps 1,
1 + num_iterations, ...; as TRL's `GRPOTrainer`, every optimizer step counts as a step and the
sampler deals a new batch of prompts only when a new generation batch is sampled): the step's
prompts (`Prompts`, this rank's share of the sampler's global batch) each get `group_size`
completions, sampled without gradient from the policy in eval mode
(`trainer.methods.rollouts`; ancestral sampling with temperature, top-k and top-p, the
generator seeded by (seed, step, rank) so a resumed run samples what the uninterrupted one
did). Each completion's text is graded against its prompt's record (`Grader.grade(sample,
item)`: the spec's graders, scored in this process, which runs inside the job's sandbox); the
graders' weighted sum is its reward, and a group's rewards give its advantages. With
`num_iterations` > 1 the policy's log-probabilities of the completions are taken then, without
gradient (`Group.old_logps`: the denominator of the importance ratio, pi_theta_old of the GRPO
paper's iterative loop, Shao et al. 2024, algorithm 1), and the reference's when `beta` > 0.
The groups are the `Rollout`, kept (and checkpointed per rank) for the cycle's steps.

Each optimizer step: one forward and backward per group (a group shares its prompt, so its G
rows need no padding), the loss normalised by the step's global completions and completion
tokens (all-reduced before the first backward), gradients reduced on the last group only.

The reference of the KL term (`beta` > 0) is `trainer.methods.dpo_train.Reference`: the policy
with its adapters disabled under LoRA, else a frozen copy of the starting weights (sharded
like the policy under FSDP). Under FSDP (`collective`), every forward is a collective: every
rank has as many groups, and sampling runs until every rank's group is done.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from trainer.methods.grpo_metrics import metrics_of_sums, sample_of, step_sums
from trainer.methods.rollouts import (
    AllDone,
    Grader,
    Group,
    Rollout,
    Sampling,
    completion_codec,
    sample_groups,
)
from trainer.parallel.parallelize import set_gradient_sync

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from jobspec.job import JobSpec
    from trainer.loop import Run
    from trainer.models.network import Network


@dataclass
class GRPOMethod:
    """GRPO as the loop's `trainer.loop.Method`, and the `Stateful` of its rollout
    (each rank's generation batch, in its checkpoint state). `run.train_rows` /
    `run.eval_rows` are not read: the prompts are `prompts` (train, eval)."""

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
    num_iterations: int = 1  # optimizer steps per generation batch (TRL's, the paper's mu)
    collective: bool = False  # forwards are collectives (FSDP): sample until all ranks are done
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    closers: Sequence[Callable[[], None]] = ()  # the graders' (their child processes)
    rollout: Rollout | None = field(default=None, repr=False)  # the current generation batch
    _sums: Tensor | None = field(default=None, repr=False)
    last_samples: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def accumulate(self, run: Run) -> Tensor:
        """`Method.accumulate`: on the first step of an iteration cycle, sample and grade
        this rank's prompts of the sampler's next global batch (the new `rollout`); then the
        step's forward/backward over the rollout's groups. Returns this rank's share of the
        step's loss (0-dim fp32)."""
        step = run.state.step
        cycle_start = step - step % self.num_iterations
        if self.rollout is None or self.rollout.step != cycle_start:
            if step != cycle_start:
                log.warning("no rollout of step %d to resume with: sampling anew", cycle_start)
            indices = np.concatenate(run.sampler.split(run.sampler.next_global_batch()))
            generator = self._generator(run.dist.device, cycle_start, run.dist.rank)
            groups = self.sample(
                run.model, self.prompts[0], indices, run.dist.device, generator, dist=run.dist
            )
            self.prepare(groups, model=run.model, dist=run.dist)
            self.rollout = Rollout(cycle_start, run.sampler.global_batch_size, groups)
        return self.accumulate_groups(
            self.rollout.groups,
            model=run.model,
            train_model=run.parallel_model,
            global_prompts=self.rollout.global_prompts,
            dp_size=run.dims.dp_size,
            dist=run.dist,
            scaler=run.scaler,
        )

    def state_dict(self) -> dict[str, Any]:
        """This rank's rollout (`Rollout.to_bytes`) while later steps may train on it, else
        nothing (num_iterations 1: every step samples anew)."""
        rollout = self.rollout if self.num_iterations > 1 else None
        return {"rollout": io.BytesIO(rollout.to_bytes() if rollout is not None else b"")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the rollout `state_dict` saved (none when it saved none)."""
        data = state["rollout"]
        raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
        self.rollout = Rollout.from_bytes(raw, self.device) if raw else None

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
        *,
        dist: DistInfo | None = None,
        sampling: Sampling | None = None,
    ) -> list[Group]:
        """Sample and grade a group for each prompt at `indices` (`sample_groups`), with
        `sampling` (default: the method's); `dist`: the ranks that wait for each other under a
        collective forward."""
        return sample_groups(
            model,
            prompts,
            indices,
            sampling=sampling or self.sampling,
            graders=self.graders,
            decode=self.decode,
            device=device,
            generator=generator,
            precision=self.precision,
            all_done=self._all_done(dist),
        )

    def _all_done(self, dist: DistInfo | None) -> AllDone | None:
        """Under a collective forward: whether every rank's group is done (an all-reduce)."""
        if not self.collective or dist is None or not dist.is_distributed:
            return None

        def all_done(finished: bool) -> bool:
            pending = torch.tensor(0.0 if finished else 1.0, device=dist.device)
            return float(all_reduce_sum(pending, dist)) == 0.0

        return all_done

    def prepare(self, groups: Sequence[Group], *, model: nn.Module, dist: DistInfo) -> None:
        """What a rollout keeps for its steps, computed once after sampling: each group's
        advantages (all ranks' rewards under `scale_rewards: batch`), its completions'
        log-probabilities under the sampling policy `model` when `num_iterations` > 1
        (`old_logps`, no gradient, in the mode training forwards run in) and under the
        reference when `beta` > 0 (`ref_logps`)."""
        self._advantages(groups, dist)
        for group in groups:
            if self.num_iterations > 1:
                with torch.no_grad():
                    group.old_logps = self._forward(model, group)[1]
            group.ref_logps = self._reference_logps(group)

    def _forward(self, model: nn.Module, group: Group) -> tuple[Tensor, Tensor]:
        """`model`'s logits (G, C, V) at `group`'s completion positions divided by the sampling
        temperature (the distribution the completions were drawn from, as TRL scales them for
        the policy, the sampling policy and the reference alike), and the (G, C) fp32
        log-probabilities of its completion tokens."""
        start = group.prompt_ids.numel() - 1
        with autocast(group.prompt_ids.device, self.precision):
            logits = model(group.ids)[:, start:-1]
        temperature = self.sampling.temperature
        if temperature not in (0.0, 1.0):  # 0: greedy evaluation, which takes no step
            logits = logits / temperature
        return logits, token_logps(logits, group.completion_ids)

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
        """One forward and backward per group; gradients reduced on the last.

        `groups` not yet prepared (no advantages) are first (`prepare`). `model`: the policy
        (sharded or plain); `train_model`: what a training forward calls (DDP(model) or
        model). The ratio's denominator is a group's `old_logps`, else the current
        log-probabilities detached (ratio 1). The loss is divided by the global normalisers
        (all-reduced here) and multiplied by `dp_size`, which the data-parallel gradient
        average divides again, so the step's gradient is that of the global loss. Returns this
        rank's share of it (0-dim fp32, detached)."""
        device = groups[0].prompt_ids.device
        if any(group.advantages is None for group in groups):
            self.prepare(groups, model=model, dist=dist)
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
            with no_sync(train_model, skip_sync=not last):
                logits, logps = self._forward(train_model, group)
                old = group.old_logps if group.old_logps is not None else logps.detach()
                assert group.advantages is not None
                loss, ratio, kl = per_token_loss(
                    logps,
                    old,
                    group.advantages,
                    epsilon_low=self.epsilon_low,
                    epsilon_high=self.epsilon_high,
                    ref_logps=group.ref_logps,
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

    def _reference_logps(self, group: Group) -> Tensor | None:
        """(G, C) fp32 log-probabilities of `group`'s completion tokens under the reference
        (in eval mode, adapters disabled under LoRA); None without a KL term."""
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
                with adapters_off:
                    return self._forward(reference.model, group)[1]
            finally:
                reference.model.train(was_training)

    def _remember(self, groups: Sequence[Group], sums: Tensor, device: torch.device) -> None:
        self._sums = step_sums(groups, sums, self.graders).to(device)
        self.last_samples = sample_of(groups[0], self.decode)

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
        sums = all_reduce_sum(self._sums.clone(), dist).tolist()
        return metrics_of_sums(sums, self.graders, beta=self.beta)

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
        )
        device = dist.device
        generator = torch.Generator(device=device).manual_seed(self.seed)
        groups = self.sample(model, prompts, indices, device, generator, dist=dist, sampling=greedy)
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
    token, the reference built when `beta` > 0 (`starting_weights`; sharded like the policy
    over `mesh`). A `mesh` (FSDP) makes every forward a collective (`GRPOMethod.collective`).

    Raises `InvalidJobError` when a grader cannot be built (`trainer.graders.GraderError`) or
    the reference cannot (as `build_network`)."""
    from trainer.graders import build_graders

    grpo = spec.method.grpo
    if grpo is None:
        raise ValueError("not a GRPO job (method.kind is not 'grpo')")
    stop, decode = completion_codec(network.tokenizer)
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
        num_iterations=grpo.num_iterations,
        collective=mesh is not None,
        device=dist_info.device,
        closers=[g.close for g in graders],
    )


def _tensor(weights: Sequence[float] | None) -> Tensor | None:
    return None if weights is None else torch.tensor(list(weights), dtype=torch.float32)
