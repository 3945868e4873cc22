"""Tolerances of the numeric tests, derived from fp32's unit roundoff rather than guessed.

The trainer's parallel layouts (DDP, FSDP, tensor and pipeline parallel, gradient
accumulation) compute the same fp32 mathematics as one process, but sum in other orders. A
recursively summed fp32 sum of n terms is off the exact sum by at most gamma_(n-1) times the sum
of the terms' magnitudes, gamma_k = k u / (1 - k u) ~= k u with u = eps / 2 (Higham, "Accuracy
and Stability of Numerical Algorithms", 2nd ed., section 4.2; pairwise and blocked orders, as in
all-reduce and BLAS, do better). Two orders are each off by that much, so they differ by at most
2 (n - 1) u = (n - 1) eps relative when the terms share a sign, as a mean cross-entropy's
per-token terms and a squared gradient norm's do.

At the first step the weights are equal and only that reordering separates the losses. Later
steps inherit weights that differ by the reordered gradients; Adam's normalised update scales a
relative gradient difference d by the learning rate (<= 1e-2 here) before it reaches a weight,
so those differences stay below the bound as well (first order). A real fault (another batch,
a missing rank's gradient, a wrong scale) moves a loss by 1e-2 relative or more.
"""

from __future__ import annotations

import torch

FP32_EPS = float(torch.finfo(torch.float32).eps)  # 2**-23, twice the unit roundoff u
# The loss tests' step of 16 sequences x 64 tokens, summed in another order: (16 x 64) eps
# relative for the loss and the gradient entries, and an absolute floor for entries near 0.
RTOL, ATOL = 16 * 64 * FP32_EPS, 1e-7


def reordered_sum_rel(n_terms: int) -> float:
    """Relative tolerance between two fp32 sums (or means) of the same `n_terms` same-sign
    terms taken in different orders: (n - 1) eps (see the module docstring)."""
    if n_terms < 1:
        raise ValueError(f"n_terms must be >= 1, got {n_terms}")
    return max(n_terms - 1, 1) * FP32_EPS


def tokens_per_step(global_batch_sequences: int, seq_len: int) -> int:
    """How many per-token losses a step's mean loss sums: sequences x positions."""
    return global_batch_sequences * seq_len
