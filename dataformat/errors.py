"""Errors that decide how the trainer exits (docs/CONTRACTS.md section 1)."""

from __future__ import annotations


class InvalidJobError(Exception):
    """The spec or the data cannot make a run; retrying will not help (exit code 2).

    Raised for an unreadable or invalid spec, a missing corpus, a corpus too small for one
    training or evaluation chunk, or a launch that contradicts the spec.
    """


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm became NaN/inf: the run stops instead of training on."""


class CheckpointWriteError(Exception):
    """Writing a checkpoint failed: the storage is full, read-only or unreachable (an `infra`
    failure, `dataformat.failures`); the original error is its `__cause__`."""
