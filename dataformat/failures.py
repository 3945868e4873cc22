"""Failure classes: why an attempt failed, in the terms its retry policy is written in.

Pure (no torch): the spec (`retries.on`), the API and the worker's lifecycle
(`core.attempts.lifecycle_policy`) share these names; the trainer writes one in its `error` event
(`failure_class`) when it knows what its own exception means.
"""

from __future__ import annotations

import enum
import errno as errnos
from collections.abc import Sequence


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


# Exception type names (of the exception or a base class) that say what failed. By name, so
# this module stays torch-free and the worker can classify the type name in an error file
# (`torch.distributed.elastic`'s `error.json` holds `"<TypeName>: <message>"`) the same way.
OOM_TYPES = frozenset({"OutOfMemoryError", "MemoryError"})
INFRA_TYPES = frozenset(
    {
        # torch.distributed: a peer vanished, the store is unreachable, a collective failed
        "DistError",
        "DistBackendError",
        "DistNetworkError",
        "DistStoreError",
        "DistQueueEmptyError",
        "ConnectionError",
        "ConnectionResetError",
        "ConnectionRefusedError",
        "ConnectionAbortedError",
        "BrokenPipeError",
        # dataformat.errors.CheckpointWriteError: storage full, read-only or unreachable
        "CheckpointWriteError",
    }
)
USER_TYPES = frozenset({"InvalidJobError"})  # the spec or the data: exit 2
# errno values of an OSError that are the machine's fault, not the code's: disk full,
# read-only file system, quota exceeded, I/O error.
INFRA_ERRNOS = frozenset({errnos.ENOSPC, errnos.EROFS, errnos.EDQUOT, errnos.EIO})
# RuntimeErrors whose message is the only sign: the CPU allocator's OOM, collective timeouts.
# torch re-raises a MemoryError from a future's callback as a RuntimeError naming it ("Got the
# following error when running the callback: MemoryError: ...").
OOM_MESSAGES = ("can't allocate memory", "CUDA out of memory", "MemoryError")
# What a surviving rank raises when a peer rank died (gloo on CPU: a plain RuntimeError), e.g.
# SIGKILLed by the OOM killer: an echo of the peer's end, not this rank's own failure.
PEER_LOST_MESSAGES = ("Connection closed by peer", "Connection reset by peer")
INFRA_MESSAGES = (
    "collective operation timeout",
    "Timed out waiting",
    "timed out after",
    *PEER_LOST_MESSAGES,
)


def classify(type_names: Sequence[str], message: str, errno: int | None = None) -> FailureClass:
    """The class of a failure from its exception's type names (the type and its bases, or the
    bare type name an error file holds), its message and, for an OSError, its errno.

    `oom`: an allocator error; `infra`: a distributed or connection error, a collective
    timeout, a failed checkpoint write, an OSError of a full / read-only / failing disk;
    `user_error`: anything else (the spec, the data, the training code).
    """
    names = set(type_names)
    if names & USER_TYPES:
        return FailureClass.USER_ERROR
    if names & OOM_TYPES or any(m in message for m in OOM_MESSAGES):
        return FailureClass.OOM
    if names & INFRA_TYPES or errno in INFRA_ERRNOS:
        return FailureClass.INFRA
    if any(m in message for m in INFRA_MESSAGES):
        return FailureClass.INFRA
    return FailureClass.USER_ERROR


def classify_exception(exc: BaseException) -> FailureClass:
    """The class of a raised exception, looking through its chain (`raise ... from`, and the
    exception being handled when it was raised) for the most telling one: an `oom` or
    `infra` cause anywhere in the chain wins over the `user_error` of its wrapper."""
    seen: set[int] = set()
    found = FailureClass.USER_ERROR
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names = [t.__name__ for t in type(current).__mro__]
        errno = current.errno if isinstance(current, OSError) else None
        cls = classify(names, str(current), errno)
        if "InvalidJobError" in names:
            return FailureClass.USER_ERROR  # the trainer's own verdict: the spec or the data
        if cls is FailureClass.OOM:
            return cls
        if cls is FailureClass.INFRA:
            found = cls
        current = current.__cause__ or current.__context__
    return found


def error_type_names(message: str) -> tuple[list[str], int | None]:
    """(type names, errno) from an error file's `"<TypeName>: <text>"` message: the bare type
    name (a dotted one's last part) and an OSError's `[Errno N]`, when present."""
    head = message.split(":", 1)[0].strip()
    names = [head.rsplit(".", 1)[-1]] if head.replace(".", "").replace("_", "").isalnum() else []
    errno = None
    marker = "[Errno "
    if marker in message:
        digits = message.split(marker, 1)[1].split("]", 1)[0]
        errno = int(digits) if digits.isdigit() else None
    return names, errno
