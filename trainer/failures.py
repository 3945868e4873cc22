"""Failure classes: why an attempt failed, in the terms its retry policy is written in.

Pure (no torch): the spec (`retries.on`), the API and the worker's lifecycle (`core.lifecycle`)
share these names; the trainer writes one in its `error` event (`failure_class`) when it knows
what its own exception means.
"""

from __future__ import annotations

import enum


class FailureClass(enum.StrEnum):
    """Why an attempt failed.

    - `oom`: out of memory, CUDA or host (an allocator error in the trainer, or the kernel's OOM
      killer).
    - `hang`: no step progress for the hang timeout; the worker dumped the stacks and killed it.
    - `node_lost`: a worker (node) of the attempt stopped heartbeating: killed, host gone.
    - `user_error`: the spec, the data or the training code raised (retrying runs the same
      code on the same data: by default not retried).
    - `infra`: the platform around the code failed: a collective timed out or a peer vanished,
      the disk filled, storage was unreachable or read-only, a rank died of a signal.
    - `preempted`: the attempt was stopped to make room for higher-priority work; it is
      requeued without using the restart budget.
    """

    OOM = "oom"
    HANG = "hang"
    NODE_LOST = "node_lost"
    USER_ERROR = "user_error"
    INFRA = "infra"
    PREEMPTED = "preempted"
