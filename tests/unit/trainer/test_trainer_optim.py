"""Learning-rate schedule values and weight-decay groups."""

from __future__ import annotations

import math

import pytest
import torch

from jobspec.job import OptimSpec
from trainer.models.gpt import GPTConfig, build_model
from trainer.optim import build_optimizer, build_scheduler, lr_factor


def factor(step: int, schedule: str, warmup: int = 10, max_steps: int = 110) -> float:
    return lr_factor(
        step, warmup_steps=warmup, max_steps=max_steps, schedule=schedule, min_lr_ratio=0.1
    )


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_warmup_rises_linearly_from_the_first_step(schedule: str) -> None:
    assert [factor(s, schedule) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])


def test_cosine_and_linear_decay_to_min_lr_ratio_and_constant_stays() -> None:
    # after warmup, progress = (step - 10) / 100
    assert factor(10, "cosine") == pytest.approx(1.0)
    assert factor(60, "cosine") == pytest.approx(0.1 + 0.9 * 0.5)
    assert factor(85, "cosine") == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(0.75 * math.pi)))
    assert factor(110, "cosine") == pytest.approx(0.1)
    assert factor(500, "cosine") == pytest.approx(0.1)
    assert factor(60, "linear") == pytest.approx(0.55)
    assert factor(110, "linear") == pytest.approx(0.1)
    assert factor(110, "constant") == 1.0
    assert factor(0, "cosine", warmup=0) == pytest.approx(1.0)


def test_scheduler_sets_the_lr_of_each_step() -> None:
    spec = OptimSpec(lr=0.01, warmup_steps=2, schedule="linear", min_lr_ratio=0.0)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    scheduler = build_scheduler(optimizer, spec, max_steps=6)
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.005, 0.01, 0.01, 0.0075, 0.005, 0.0025])


def test_weight_decay_only_on_linear_matrices() -> None:
    cfg = GPTConfig(n_layers=1, n_heads=2, d_model=16, d_ff=32, seq_len=8)
    model = build_model(cfg, device=torch.device("cpu"), seed=0)
    optimizer = build_optimizer(model, OptimSpec(weight_decay=0.1))
    decayed, plain = optimizer.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert {names[id(p)] for p in decayed["params"]} == {
        f"blocks.0.{m}.weight" for m in ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.fc",
                                         "mlp.proj")
    }  # fmt: skip
    assert "wte.weight" in {names[id(p)] for p in plain["params"]}
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_fused_adamw_takes_the_same_steps_as_foreach() -> None:
    """`fused=True` (the trainer's choice on CUDA) is torch's fused kernel with the same
    groups and hyperparameters: three steps on equal models agree within rounding."""
    cfg = GPTConfig(n_layers=1, n_heads=2, d_model=16, d_ff=32, seq_len=8)
    models = [build_model(cfg, device=torch.device("cpu"), seed=3) for _ in range(2)]
    spec = OptimSpec(lr=0.01, weight_decay=0.1)
    fused, foreach = build_optimizer(models[0], spec, fused=True), build_optimizer(models[1], spec)
    assert fused.defaults["fused"] is True and not foreach.defaults["fused"]
    assert [g["weight_decay"] for g in fused.param_groups] == [0.1, 0.0]
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        for model, opt in zip(models, (fused, foreach), strict=True):
            model(ids).float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
