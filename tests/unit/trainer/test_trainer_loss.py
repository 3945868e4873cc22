"""The step's loss is normalised by the supervised positions of the whole global batch, so
gradient accumulation over examples of unequal supervised lengths equals one big micro-batch.

Tolerance: the two layouts sum the same G x T = 1024 token gradients in another order (per
micro-batch first, then across micro-batches); fp32 reordering moves a sum by at most
(number of terms) x eps relative, so rtol = 1024 x 2^-23 ~ 1.2e-4, with an absolute floor of
1e-7 for entries that cancel to ~0. The per-micro-batch mean differs from the global token
mean by far more than that on these rows (asserted, so the test can fail).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.tolerances import ATOL, RTOL
from tests.support.training import build_rows_run, cpu_world_of_one, tiny_spec, uneven_rows
from trainer.data.batches import forward, lm_loss, next_step_batches
from trainer.data.rows import IGNORE_INDEX
from trainer.loop import Run, train_step

SEQ_LEN = 64
GLOBAL_BATCH = 16


def _run(corpus_dir: Path, tmp_path: Path, micro: int, accum: int) -> Run:
    spec = tiny_spec(corpus_dir, train={"micro_batch_size": micro, "grad_accum_steps": accum})
    rows = uneven_rows(48, SEQ_LEN, seed=3)
    return build_rows_run(spec, rows, tmp_path / f"{micro}x{accum}", cpu_world_of_one())


def step_gradients(run: Run) -> tuple[float, list[torch.Tensor]]:
    """One `train_step`; (its loss, the gradients the optimizer stepped with)."""
    grads: list[torch.Tensor] = []
    run.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.extend(p.grad.clone() for p in run.model.parameters())
    )
    loss, _, _ = train_step(run)
    return float(loss), grads


def _max_rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float(((x - y).abs() / (y.abs() + ATOL)).max()) for x, y in zip(a, b, strict=True))


def test_accumulating_four_micro_batches_equals_four_times_the_micro_batch(
    corpus_dir: Path, tmp_path: Path
) -> None:
    big = _run(corpus_dir, tmp_path, micro=GLOBAL_BATCH, accum=1)
    indices = big.sampler.permutation(0)[:GLOBAL_BATCH]  # the first step's rows
    batch = big.train_rows.batch(indices, torch.device("cpu"))
    supervised = (batch.labels != IGNORE_INDEX).sum(dim=1)
    assert len(set(supervised.tolist())) > 8  # unequal lengths, 1..64 supervised positions
    with torch.no_grad():
        token_mean = float(lm_loss(forward(big.model, batch, plain=False), batch.labels))

    loss_big, grads_big = step_gradients(big)
    accumulated = _run(corpus_dir, tmp_path, micro=GLOBAL_BATCH // 4, accum=4)
    loss_acc, grads_acc = step_gradients(accumulated)

    assert loss_big == pytest.approx(token_mean, rel=RTOL)  # the reported loss: token mean
    assert loss_acc == pytest.approx(token_mean, rel=RTOL)
    for g_acc, g_big in zip(grads_acc, grads_big, strict=True):
        torch.testing.assert_close(g_acc, g_big, rtol=RTOL, atol=ATOL)


def test_a_mean_per_micro_batch_would_weight_short_examples_wrongly(
    corpus_dir: Path, tmp_path: Path
) -> None:
    """The normalisation the loop avoids: mean over each micro-batch, then over the four."""
    big = _run(corpus_dir, tmp_path, micro=GLOBAL_BATCH, accum=1)
    _, grads_big = step_gradients(big)
    naive = _run(corpus_dir, tmp_path, micro=GLOBAL_BATCH // 4, accum=4)
    step = next_step_batches(naive.sampler, naive.train_rows)
    for indices in step.micro_batches:
        batch = naive.train_rows.batch(indices, torch.device("cpu"))
        logits = forward(naive.model, batch, plain=False)
        (lm_loss(logits, batch.labels) / len(step.micro_batches)).backward()
    grads_naive = [p.grad for p in naive.model.parameters()]
    assert _max_rel_diff(grads_naive, grads_big) > 100 * RTOL
