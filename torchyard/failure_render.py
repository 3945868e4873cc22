"""Why a job failed, for the terminal: the first thing `torchyard show` prints for a failed or
restarted job, and the failure class beside the state in `torchyard jobs`.

Pure functions from the SDK's `Job` to `rich` renderables; the reason and log lines are user
text, wrapped in `Text` so square brackets in them are never read as markup.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from torchyard.types import Failure, Job

FAILED_STYLE = "bold red"
WARNING_STYLE = "yellow"


def where(failure: Failure) -> str:
    """``rank 3 on host-b, exit 1``: the failing rank, its host (or node), its exit code."""
    place = f"node {failure.node_rank}" if failure.node_rank is not None else None
    place = failure.host or place
    parts = []
    if failure.rank is not None:
        parts.append(f"rank {failure.rank}" + (f" on {place}" if place else ""))
    elif place:
        parts.append(f"on {place}")
    if failure.exit_code is not None:
        parts.append(f"exit {failure.exit_code}")
    return ", ".join(parts)


def headline(job: Job) -> Text | None:
    """``failed: [oom] CUDA out of memory ... (rank 3 on host-b, exit 1)`` for a failed job (its
    `error` when no failure was recorded, e.g. a runtime limit); ``last failure: [infra] ...``
    for a job restarted after one; None for a job that never failed."""
    failure = job.failure
    if failure is None:
        if job.state != "failed":
            return None
        reason = (job.error or "no reason recorded").splitlines()[0]
        return Text(f"failed: {reason}", style=FAILED_STYLE)
    failed = job.state == "failed"
    text = Text("failed: " if failed else "last failure: ", style=FAILED_STYLE)
    text.append(f"[{failure.failure_class}] {failure.reason}")
    if place := where(failure):
        text.append(f" ({place})")
    if not failed:
        text.stylize(WARNING_STYLE)
    return text


def failure_block(job: Job) -> Group | None:
    """What `torchyard show` prints first: the headline, the restarts used per class against
    their budget and what the policy did, then the failing rank's last log lines."""
    head = headline(job)
    if head is None:
        return None
    parts: list[Text] = [head]
    if job.retry_policy is not None:
        parts.append(Text(f"restarts: {job.retry_policy.summary}"))
    failure = job.failure
    if failure is not None:
        parts.extend(Text(f"hint: {hint}", style=WARNING_STYLE) for hint in failure.hints)
    if failure is not None and failure.log_tail:
        who = "" if failure.rank is None else f" of rank {failure.rank}"
        parts.append(Text(f"last log lines{who}:", style="bold"))
        parts.extend(Text(f"  {line}", style="dim") for line in failure.log_tail)
    return Group(*parts)


def state_with_class(job: Job, style: str) -> Text:
    """The state, and the latest failure's class beside it: ``failed (oom)``, or ``running
    (after infra)`` for a job restarted after a failure."""
    text = Text(job.state, style=style)
    if job.failure is not None:
        after = "" if job.state == "failed" else "after "
        text.append(f" ({after}{job.failure.failure_class})", style="red" if not after else "")
    return text
