"""GRPO's step (`trainer.methods.grpo_train`) in one process: sampling a group (stop ids,
masks, top-p), and a policy that learns what its grader rewards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dataformat.metrics import trainer_metrics
from trainer.data.prompts import Prompts
from trainer.distributed import DistInfo
from trainer.methods.grpo_train import GRPOMethod
from trainer.methods.rollouts import Sampling, filter_logits, sample_group

GOOD = 3  # the id the toy grader rewards
ALPHABET = 8  # ids the toy policy samples from (so the good one is drawn 1 time in 8 at first)


class TinyLlama(nn.Module):
    """A 2-layer Llama over byte ids, called as the trainer calls its models: ids -> logits."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=256,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.llama = LlamaForCausalLM(config)

    def forward(self, ids: Tensor) -> Tensor:
        return self.llama(input_ids=ids).logits


LOWER_SOURCE = """
def grade(sample, item):
    text = sample["output_text"]
    return sum(c.islower() for c in text) / max(len(text), 1)
"""


class ShareOfGood:
    """Reward: the share of the completion's characters that are chr(GOOD)."""

    name = "good"

    def grade(self, sample: dict[str, Any], item: dict[str, Any]) -> float:
        text = sample["output_text"]
        return text.count(chr(GOOD)) / len(text) if text else 0.0


def _prompts(n: int) -> Prompts:
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, ALPHABET, size=int(rng.integers(3, 7))) for _ in range(n)]
    return Prompts(ids=ids, records=[{"i": i} for i in range(n)])


def _decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def test_a_group_stops_at_its_stop_id_and_masks_what_follows() -> None:
    model = TinyLlama(seed=0)
    sampling = Sampling(group_size=16, max_new_tokens=12, stop_ids=(1,), vocab_size=ALPHABET)
    generator = torch.Generator().manual_seed(0)
    ids, mask = sample_group(model, torch.tensor([2, 5, 4]), sampling, generator)
    assert ids.shape == mask.shape and ids.shape[0] == 16 and ids.shape[1] <= 12
    assert int(ids.max()) < ALPHABET, "ids past vocab_size are never sampled"
    stopped = 0
    for row, m in zip(ids.tolist(), mask.tolist(), strict=True):
        length = sum(m)
        assert m == [1] * length + [0] * (len(m) - length), "the mask is a prefix"
        if 1 in row[:length]:
            stopped += 1
            assert row.index(1) == length - 1, "a completion ends with its first stop id"
            assert all(t == 1 for t in row[length:]), "after the stop: the stop id repeated"
        else:
            assert length == len(m)
    assert stopped > 0
    assert model.training, "the model's mode is given back"


def test_top_p_keeps_the_smallest_set_reaching_p_and_top_k_the_k_most_likely() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(filter_logits(logits, top_k=None, top_p=0.7))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(filter_logits(logits, top_k=None, top_p=0.8))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(filter_logits(logits, top_k=None, top_p=0.81))
    assert kept.tolist() == [[True, True, True, False]]
    kept = torch.isfinite(filter_logits(logits, top_k=1, top_p=1.0))
    assert kept.tolist() == [[True, False, False, False]]


def test_the_policy_learns_what_its_grader_rewards() -> None:
    torch.manual_seed(0)
    model = TinyLlama(seed=1)
    prompts = _prompts(16)
    method = GRPOMethod(
        prompts=(prompts, prompts),
        graders=[ShareOfGood()],
        sampling=Sampling(group_size=8, max_new_tokens=6, vocab_size=ALPHABET),
        decode=_decode,
        loss_type="dapo",
    )
    dist = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    rewards = []
    for step in range(30):
        indices = rng.choice(len(prompts), size=4, replace=False)
        generator = torch.Generator().manual_seed(step)
        groups = method.sample(model, prompts, indices, dist.device, generator)
        method.accumulate_groups(
            groups, model=model, train_model=model, global_prompts=4, dp_size=1, dist=dist
        )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        metrics = method.step_metrics(dist)
        rewards.append(metrics["reward"])
        assert metrics["reward/good"] == metrics["reward"]
        assert 0.0 <= metrics["frac_reward_zero_std"] <= 1.0
        assert metrics["completion_length"] == 6.0
        assert set(metrics) <= trainer_metrics("grpo", graders=("good",)), "the names sweeps check"
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    assert first < 0.3, f"an untrained policy draws the good id about 1 time in 8 ({first:.2f})"
    assert last > 0.6, f"after 30 steps the policy prefers it: {first:.2f} -> {last:.2f}"
    scores = method.evaluate_prompts(model, prompts, np.arange(len(prompts)), dist)
    assert scores["eval_reward"] > 0.6 and scores["eval_loss"] == -scores["eval_reward"]


def test_with_lora_and_beta_the_reference_is_the_policy_with_its_adapters_off() -> None:
    """No second copy of the weights: the KL is exactly 0 before the adapters move (LoRA's B
    starts at 0) and grows once they have."""
    from tests.support.training import FINE_TUNE, cpu_world_of_one, tiny_spec
    from trainer.methods.grpo_train import build_grpo
    from trainer.models.network import build_network

    spec = tiny_spec(
        Path("/unused"),
        model={"seq_len": 32, **FINE_TUNE},
        lora={"r": 4},
        method={
            "kind": "grpo",
            "grpo": {
                "group_size": 4,
                "max_new_tokens": 6,
                "beta": 0.5,
                "graders": [
                    {"type": "python", "name": "lower", "source": LOWER_SOURCE},
                ],
            },
        },
    )
    dist = cpu_world_of_one()
    network = build_network(spec, device=dist.device, dist_info=dist)
    assert network.peft_model is not None
    method = build_grpo(
        spec, network, network.model, dist_info=dist, mesh=None, prompts=(_prompts(4),) * 2
    )
    try:
        assert method.reference is not None and method.reference.model is network.model
        optimizer = torch.optim.AdamW(
            [p for p in network.model.parameters() if p.requires_grad], lr=5e-2
        )
        kls = []
        for step in range(3):
            generator = torch.Generator().manual_seed(step)
            groups = method.sample(network.model, _prompts(4), np.arange(4), dist.device, generator)
            method.accumulate_groups(
                groups,
                model=network.model,
                train_model=network.model,
                global_prompts=4,
                dp_size=1,
                dist=dist,
            )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            kls.append(method.step_metrics(dist)["kl"])
    finally:
        method.close()
    assert kls[0] == 0.0, "before any update the policy is its reference"
    assert kls[1] > 0.0 and kls[2] > 0.0, kls


def test_a_rank_waiting_for_the_others_samples_what_it_would_alone() -> None:
    """Under a collective forward a rank whose group is done keeps calling the model until
    every rank's is; it samples nothing more (same ids, same generator state)."""
    model = TinyLlama(seed=0)
    sampling = Sampling(group_size=4, max_new_tokens=10, stop_ids=(1, 2), vocab_size=ALPHABET)
    prompt = torch.tensor([2, 5, 4])
    alone_generator = torch.Generator().manual_seed(3)
    alone = sample_group(model, prompt, sampling, alone_generator)
    assert alone[0].shape[1] == 5, "this seed's group is done after 5 of its 10 tokens"
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    asked: list[bool] = []

    def others_need_two_more(finished: bool) -> bool:  # another rank's group runs longer
        asked.append(finished)
        return finished and asked.count(True) > 2

    generator = torch.Generator().manual_seed(3)
    waited = sample_group(model, prompt, sampling, generator, all_done=others_need_two_more)
    for got, want in zip(waited, alone, strict=True):
        assert torch.equal(got, want)
    assert torch.equal(generator.get_state(), alone_generator.get_state())
    assert len(calls) == 5 + 2, "two forwards more, for the other rank"


def test_sampling_with_the_kv_cache_draws_what_sampling_without_it_does() -> None:
    """`HFCausalLM.decode_step` (transformers' KV cache, the newest token only after the first
    step) samples the very completions the whole-sequence forward does, greedy and at
    temperature 1 with the same generator, and stops at a stop id alike."""
    from trainer.models.hf import HFCausalLM

    llama = TinyLlama(seed=3).llama
    cached = HFCausalLM(llama, seq_len=64)
    whole = TinyLlama(seed=3)  # ids -> logits, no decode_step: the whole sequence each step
    calls: list[int] = []
    cached.lm.register_forward_pre_hook(
        lambda _m, a, kw: calls.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    prompt = torch.tensor([5, 9, 2, 7])
    for temperature in (0.0, 1.0):
        sampling = Sampling(
            group_size=6, max_new_tokens=10, temperature=temperature, stop_ids=(1,),
            vocab_size=ALPHABET,
        )  # fmt: skip
        calls.clear()
        got = sample_group(cached, prompt, sampling, torch.Generator().manual_seed(11))
        want = sample_group(whole, prompt, sampling, torch.Generator().manual_seed(11))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), temperature
        assert calls[0] == 4 and set(calls[1:]) == {1}, "one new token per step after the prompt"
