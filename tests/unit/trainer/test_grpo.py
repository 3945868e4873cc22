"""GRPO's advantages and loss (`trainer.methods.grpo`) against TRL's `GRPOTrainer` (trl 1.16,
the reference the issue names): a real trainer on a tiny Llama built from a config and a
tokenizer trained here, its own `_generate_and_score_completions` (real sampling, rewards from a
function) and `_compute_loss` (its log-probabilities, clipping, KL, normalisation), compared on
the same tensors, without generation of ours; and with `num_iterations` 2, TRL's generation
batch (its log-probabilities at sampling) trained on by `GRPOMethod` a second time after the
policy moved, where ratios clip. Relative tolerance 1e-5."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from demos.offline_llama import ModelShape, build_llama, stdlib_texts, train_tokenizer
from trainer.methods.grpo import (
    LOSS_TYPES,
    SCALE_REWARDS,
    STATISTICS,
    Normalisers,
    aggregate,
    combine_rewards,
    group_advantages,
    loss_statistics,
    per_token_loss,
    token_logps,
)

GROUP_SIZE = 4
MAX_COMPLETION_LENGTH = 8
# Rewards of three prompts' completions: a spread group, one with a tie, one all equal (no
# signal: advantage 0 and counted as zero-std).
REWARDS = [1.0, 0.0, 0.5, 1.0, 0.25, 0.25, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
PROMPTS = ["def wrap(text", "import re\n", "class TextWrapper"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer Llama and its tokenizer saved to disk (TRL loads its reference model from
    the policy's path)."""
    out = tmp_path_factory.mktemp("grpo") / "model"
    tokenizer = train_tokenizer(stdlib_texts(["textwrap"]), vocab_size=300)
    shape = ModelShape(hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    build_llama(tokenizer, shape, seed=0).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def _trl(model_dir: Path, **config: Any) -> Any:
    """A `trl.GRPOTrainer` on the model at `model_dir`, beta 0.04, on CPU; temperature 1 unless
    `config` says otherwise."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions: list[Any], **_: Any) -> list[float]:
        return REWARDS[: len(completions)]

    config = {"temperature": 1.0, **config}
    args = GRPOConfig(
        output_dir=str(model_dir.parent / "trl"),
        per_device_train_batch_size=len(REWARDS),
        num_generations=GROUP_SIZE,
        max_completion_length=MAX_COMPLETION_LENGTH,
        beta=0.04,
        epsilon=0.2,
        epsilon_high=0.28,
        report_to=[],
        use_cpu=True,
        bf16=False,  # TRL's default autocasts to bf16 where the host can: compare in fp32
        save_strategy="no",
        **config,
    )
    dataset = Dataset.from_list([{"prompt": p} for p in PROMPTS])
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(str(model_dir)),
    )
    trainer.current_gradient_accumulation_steps = 1  # set by its training loop, which we skip
    return trainer


@pytest.fixture(scope="module")
def trl_trainer(model_dir: Path) -> Iterator[Any]:
    """TRL's trainer as configured by default (one iteration per generation batch)."""
    yield _trl(model_dir)


@pytest.mark.parametrize("scale_rewards", SCALE_REWARDS)
def test_advantages_equal_trls_on_its_own_sampled_batch(
    trl_trainer: Any, scale_rewards: str
) -> None:
    trl_trainer.scale_rewards = scale_rewards
    trl_trainer.model.train()  # TRL files a training batch's metrics under "train"
    inputs = [{"prompt": p} for p in PROMPTS for _ in range(GROUP_SIZE)]
    scored = trl_trainer._generate_and_score_completions(inputs)

    ours, zero_std = group_advantages(torch.tensor(REWARDS), GROUP_SIZE, scale_rewards)

    torch.testing.assert_close(ours, scored["advantages"], rtol=1e-5, atol=1e-6)
    assert ours[8:].abs().max() == 0, "a group of equal rewards carries no advantage"
    if scale_rewards != "batch":
        assert zero_std.tolist() == [False] * 8 + [True] * 4
    # TRL's own logged fraction of zero-std groups is the same count.
    logged = trl_trainer._metrics["train"]["frac_reward_zero_std"][-1]
    assert logged == pytest.approx(zero_std.float().mean().item())


def test_an_unscorable_completion_is_left_out_of_its_group_and_gets_no_advantage() -> None:
    per_grader = torch.tensor(
        [[1.0, float("nan")], [float("nan"), float("nan")], [0.0, 1.0], [0.0, 0.0]]
    )
    rewards = combine_rewards(per_grader, torch.tensor([1.0, 0.5]))
    assert rewards[0] == 1.0 and math.isnan(rewards[1]) and rewards[2] == 0.5
    advantages, _ = group_advantages(rewards, 4, "none")
    mean = (1.0 + 0.5 + 0.0) / 3
    torch.testing.assert_close(advantages, torch.tensor([1.0 - mean, 0.0, 0.5 - mean, -mean]))


def test_rewards_that_are_not_whole_groups_are_refused() -> None:
    with pytest.raises(ValueError, match="not whole groups of 4"):
        group_advantages(torch.zeros(6), 4)


def _fixed_batch(trainer: Any) -> dict[str, torch.Tensor]:
    """Prompts of equal length (no padding), completions of 5-8 tokens, advantages, and old
    and reference log-probabilities off the policy's by up to +-0.4 nats, so that some ratios
    clip on each side and the KL is not zero."""
    generator = torch.Generator().manual_seed(7)
    vocab = trainer.model.config.vocab_size
    batch, prompt_len = 6, 5
    prompt_ids = torch.randint(0, vocab, (batch, prompt_len), generator=generator)
    completion_ids = torch.randint(0, vocab, (batch, MAX_COMPLETION_LENGTH), generator=generator)
    lengths = torch.tensor([8, 5, 7, 8, 6, 5])
    completion_mask = (torch.arange(MAX_COMPLETION_LENGTH) < lengths[:, None]).long()
    with torch.no_grad():
        logits = trainer.model(torch.cat([prompt_ids, completion_ids], 1)).logits
        logps = token_logps(logits[:, prompt_len - 1 : -1], completion_ids)
    noise = (torch.rand(2, batch, MAX_COMPLETION_LENGTH, generator=generator) - 0.5) * 0.8
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.2, 0.7, 0.3, -1.5, 0.9, 1.1]),
        "old_per_token_logps": logps + noise[0],
        "ref_per_token_logps": logps + noise[1],
        "num_items_in_batch": completion_mask.sum(),
    }


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_gradients_and_statistics_equal_trls_compute_loss(
    trl_trainer: Any, loss_type: str
) -> None:
    model = trl_trainer.model
    model.train()
    trl_trainer.loss_type = loss_type
    inputs = _fixed_batch(trl_trainer)

    model.zero_grad()
    theirs = trl_trainer._compute_loss(model, inputs)
    theirs.backward()
    their_grads = _grads(model)
    metrics = {k: v[-1] for k, v in trl_trainer._metrics["train"].items() if v}

    model.zero_grad()
    prompt_len = inputs["prompt_ids"].shape[1]
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    logps = token_logps(model(ids).logits[:, prompt_len - 1 : -1], inputs["completion_ids"])
    mask = inputs["completion_mask"]
    loss, ratio, kl = per_token_loss(
        logps,
        inputs["old_per_token_logps"],
        inputs["advantages"],
        epsilon_low=0.2,
        epsilon_high=0.28,
        ref_logps=inputs["ref_per_token_logps"],
        beta=0.04,
    )
    norm = Normalisers(
        completions=mask.shape[0],
        tokens=int(mask.sum()),
        max_completion_length=MAX_COMPLETION_LENGTH,
    )
    ours = aggregate(loss, mask, loss_type, norm)
    ours.backward()

    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=0)
    for name, grad in _grads(model).items():
        # An entry that is a sum cancelling to near 0 keeps fp32's absolute error of the sum's
        # terms (TRL's fused head divides by the temperature in another order): atol 1e-6 of
        # the largest entry (1 entry in 9600 needed it at temperature 0.7: 1.2e-8 apart)
        atol = max(1e-8, 1e-6 * float(their_grads[name].abs().max()))
        torch.testing.assert_close(
            grad,
            their_grads[name],
            rtol=1e-5,
            atol=atol,
            msg=lambda m: f"{name}: {m}",  # noqa: B023
        )

    sums = loss_statistics(
        ratio, inputs["advantages"], mask, epsilon_low=0.2, epsilon_high=0.28, kl=kl
    )
    stats = dict(zip(STATISTICS, (sums[:-1] / sums[-1]).tolist(), strict=False))
    assert stats["clip_ratio/low"] > 0 and stats["clip_ratio/high"] > 0, "the batch clips both ways"
    for name, trl_name in [
        ("kl", "kl"),
        ("clip_ratio/low", "clip_ratio/low_mean"),
        ("clip_ratio/high", "clip_ratio/high_mean"),
        ("clip_ratio/region", "clip_ratio/region_mean"),
    ]:
        assert stats[name] == pytest.approx(metrics[trl_name], rel=1e-5), name


def test_a_step_split_into_micro_batches_sums_to_the_whole_batchs_loss(trl_trainer: Any) -> None:
    """The global normalisers make the shares of any split add up to the one-batch loss (TRL's
    local `grpo`/`bnpo` normalisation would not)."""
    inputs = _fixed_batch(trl_trainer)
    mask = inputs["completion_mask"]
    logps = inputs["old_per_token_logps"] + 0.1
    norm = Normalisers(mask.shape[0], int(mask.sum()), MAX_COMPLETION_LENGTH)
    for loss_type in LOSS_TYPES:

        def share(rows: slice) -> torch.Tensor:
            loss, _, _ = per_token_loss(
                logps[rows],
                inputs["old_per_token_logps"][rows],
                inputs["advantages"][rows],
                epsilon_low=0.2,
                epsilon_high=0.2,
            )
            return aggregate(loss, mask[rows], loss_type, norm)  # noqa: B023

        whole = share(slice(None))
        split = share(slice(0, 1)) + share(slice(1, 4)) + share(slice(4, None))
        torch.testing.assert_close(split, whole, rtol=1e-6, atol=0, msg=loss_type)


def test_beta_without_reference_logps_is_refused() -> None:
    logps = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="reference"):
        per_token_loss(logps, logps, torch.ones(2), epsilon_low=0.2, epsilon_high=0.2, beta=0.1)


class _Logits(torch.nn.Module):
    """A Hugging Face causal LM called as the trainer calls its models: ids -> logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits


class _Listed:
    """A grader whose scores are the group's entries of REWARDS (set per group)."""

    name = "listed"


@pytest.mark.parametrize(
    ("loss_type", "temperature"), [*((t, 1.0) for t in LOSS_TYPES), ("grpo", 0.7)]
)
def test_a_second_iteration_on_a_generation_batch_equals_trls(
    model_dir: Path, loss_type: str, temperature: float
) -> None:
    """num_iterations 2: TRL's own generation batch (its completions, its log-probabilities of
    them at sampling, `old_per_token_logps`), our rollout of the same completions prepared by
    `GRPOMethod.prepare` under the sampling policy, then the policy moved (as by the first
    iteration's update) and the second iteration's loss, gradients and clip ratios of both.
    At a temperature other than 1, both take every log-probability (policy, sampling policy,
    reference) and the entropy of the logits divided by it: the distribution sampled from."""
    from tests.support.training import cpu_world_of_one
    from trainer.data.prompts import Prompts
    from trainer.methods.dpo_train import Reference
    from trainer.methods.grpo_train import GRPOMethod
    from trainer.methods.rollouts import Group, Sampling

    trainer = _trl(model_dir, num_iterations=2, loss_type=loss_type, temperature=temperature)
    model = trainer.model
    model.train()
    # One prompt for every group: no padding, so our unpadded forwards see TRL's inputs.
    scored = trainer._generate_and_score_completions([{"prompt": PROMPTS[0]}] * len(REWARDS))
    assert scored["old_per_token_logps"] is not None, "TRL keeps the sampling policy's logps"
    prompt = scored["prompt_ids"][0]
    assert bool((scored["prompt_ids"] == prompt).all()) and bool(scored["prompt_mask"].all())
    mask = scored["completion_mask"]
    groups = [
        Group(
            prompt_ids=prompt,
            completion_ids=scored["completion_ids"][i : i + GROUP_SIZE],
            mask=mask[i : i + GROUP_SIZE],
            texts=[""] * GROUP_SIZE,
            rewards=torch.tensor(REWARDS[i : i + GROUP_SIZE]).unsqueeze(1),
        )
        for i in range(0, len(REWARDS), GROUP_SIZE)
    ]
    method = GRPOMethod(
        prompts=(Prompts(ids=[], records=[]),) * 2,
        graders=[_Listed()],  # type: ignore[list-item]
        sampling=Sampling(
            group_size=GROUP_SIZE, max_new_tokens=MAX_COMPLETION_LENGTH, temperature=temperature
        ),
        decode=lambda ids: "",
        loss_type=loss_type,  # type: ignore[arg-type]
        epsilon_low=0.2,
        epsilon_high=0.28,
        beta=0.04,
        reference=Reference(model=_Logits(trainer.ref_model)),
        num_iterations=2,
    )
    policy, dist = _Logits(model), cpu_world_of_one()
    method.prepare(groups, model=policy, dist=dist)
    for name, key in (("old_logps", "old_per_token_logps"), ("ref_logps", "ref_per_token_logps")):
        ours = torch.cat([getattr(g, name) for g in groups])
        torch.testing.assert_close(ours * mask, scored[key] * mask, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        torch.cat([g.advantages for g in groups]), scored["advantages"], rtol=1e-5, atol=1e-6
    )

    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # the first iteration's update, exaggerated so that ratios clip
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)

    model.zero_grad()
    theirs = trainer._compute_loss(model, scored)
    theirs.backward()
    their_grads = _grads(model)
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items() if v}

    model.zero_grad()
    ours = method.accumulate_groups(
        groups, model=policy, train_model=policy, global_prompts=3, dp_size=1, dist=dist
    )
    torch.testing.assert_close(ours, theirs.detach(), rtol=1e-5, atol=0)
    for name, grad in _grads(model).items():
        # An entry that is a sum cancelling to near 0 keeps fp32's absolute error of the sum's
        # terms (TRL's fused head divides by the temperature in another order): atol 1e-6 of
        # the largest entry (1 entry in 9600 needed it at temperature 0.7: 1.2e-8 apart)
        atol = max(1e-8, 1e-6 * float(their_grads[name].abs().max()))
        torch.testing.assert_close(
            grad,
            their_grads[name],
            rtol=1e-5,
            atol=atol,
            msg=lambda m: f"{name}: {m}",  # noqa: B023
        )
    metrics = method.step_metrics(dist)
    assert metrics["clip_ratio/low"] > 0 and metrics["clip_ratio/high"] > 0, metrics
    for name in ("clip_ratio/low", "clip_ratio/high", "clip_ratio/region"):
        assert metrics[name] == pytest.approx(logged[f"{name}_mean"], rel=1e-5), name
    assert metrics["kl"] == pytest.approx(logged["kl"], rel=1e-5)
