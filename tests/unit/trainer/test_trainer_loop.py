"""The model and one training step, in process (world of one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataformat.errors import NonFiniteError
from tests.support.tolerances import reordered_sum_rel, tokens_per_step
from tests.support.training import build_local_run, tiny_spec
from trainer.loop import Run, train_step
from trainer.methods.sft import evaluate
from trainer.models.gpt import GPTConfig, build_model, generate

CFG = GPTConfig(n_layers=2, n_heads=4, d_model=64, d_ff=256, seq_len=32)


def test_init_is_a_function_of_the_seed() -> None:
    a, b, c = (build_model(CFG, device=torch.device("cpu"), seed=s) for s in (1, 1, 2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.wte.weight, c.wte.weight)


def test_attention_is_causal() -> None:
    model = build_model(CFG, device=torch.device("cpu"), seed=0)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    changed = x.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 256
    with torch.no_grad():
        out, out_changed = model(x), model(changed)
    assert out.shape == (2, 32, 256)
    assert torch.equal(out[:, :20], out_changed[:, :20])
    assert not torch.allclose(out[:, 20:], out_changed[:, 20:])


def test_generate_is_reproducible_from_the_generator_seed() -> None:
    model = build_model(CFG, device=torch.device("cpu"), seed=0)
    prompt = torch.tensor([100, 101, 102])

    def sample(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        return generate(model, prompt, 40, 0.8, gen).tolist()  # longer than seq_len: cropped

    assert len(sample(0)) == 40
    assert sample(0) == sample(0) != sample(1)
    assert model.training  # generate restores the mode


def _step(run: Run) -> tuple[float, float, list[torch.Tensor]]:
    """One train_step; returns (loss, grad_norm, the gradients the optimizer stepped with)."""
    grads: list[torch.Tensor] = []
    run.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.extend(p.grad.clone() for p in run.model.parameters())
    )
    loss, grad_norm, _ = train_step(run)
    return float(loss), grad_norm, grads


def test_grad_accumulation_matches_one_big_micro_batch(corpus_dir: Path, tmp_path: Path) -> None:
    big = build_local_run(tiny_spec(corpus_dir, train={"micro_batch_size": 16}), tmp_path)
    accumulated = build_local_run(
        tiny_spec(corpus_dir, train={"micro_batch_size": 8, "grad_accum_steps": 2}), tmp_path
    )
    loss_big, norm_big, grads_big = _step(big)
    loss_acc, norm_acc, grads_acc = _step(accumulated)
    # The same 16 x 64 per-token losses, summed as 2 halves: (n - 1) eps
    # (tests/support/tolerances.py).
    tolerance = reordered_sum_rel(tokens_per_step(16, 64))
    assert loss_acc == pytest.approx(loss_big, rel=tolerance)
    assert norm_acc == pytest.approx(norm_big, rel=tolerance)
    for g_acc, g_big in zip(grads_acc, grads_big, strict=True):
        torch.testing.assert_close(g_acc, g_big, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_steps_track_fp32(precision: str, corpus_dir: Path, tmp_path: Path) -> None:
    fp32 = build_local_run(tiny_spec(corpus_dir, train={"micro_batch_size": 4}), tmp_path)
    mixed_spec = tiny_spec(corpus_dir, train={"micro_batch_size": 4, "precision": precision})
    mixed = build_local_run(mixed_spec, tmp_path)
    assert (mixed.scaler is not None) == (precision == "fp16")
    for _ in range(3):
        loss32, _, _ = _step(fp32)
        loss_mixed, norm, _ = _step(mixed)
        assert loss_mixed == pytest.approx(loss32, abs=0.05)
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    assert torch.isfinite(torch.tensor(norm))


def test_non_finite_gradients_stop_the_run(corpus_dir: Path, tmp_path: Path) -> None:
    run = build_local_run(tiny_spec(corpus_dir, train={"micro_batch_size": 2}), tmp_path)
    with torch.no_grad():
        run.model.blocks["0"].mlp.fc.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="gradient norm is nan at step 1"):
        train_step(run)


def test_eval_loss_of_a_fresh_model_is_near_uniform(corpus_dir: Path, tmp_path: Path) -> None:
    run = build_local_run(tiny_spec(corpus_dir), tmp_path)
    assert evaluate(run) == pytest.approx(torch.log(torch.tensor(256.0)).item(), abs=0.1)
