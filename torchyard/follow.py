"""Live view of a running job: a progress bar with step/max_steps, loss, tokens/s and ETA.

`StepRate` (the ETA arithmetic) is pure and unit-tested; `follow_job` drives it from
`Jobs.follow` and prints state changes, evaluations and checkpoints above the bar.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from dataformat.metrics import headline_metrics
from torchyard.client import Client
from torchyard.eval_results import fetch_evaluations
from torchyard.render import STATE_STYLES, log_line
from torchyard.summary import JobSummary, summarize
from torchyard.types import Event, Job, LogLine, MetricPoint
from torchyard.units import format_duration, format_metric, format_rate, format_value


@dataclass
class StepRate:
    """Steps per second over a sliding window of (time, step) observations, and the ETA.

    `window_s` bounds how far back the rate looks, so it follows the run's current speed
    rather than including start-up. Times are seconds on any monotonic clock.
    """

    window_s: float = 60.0
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def observe(self, step: int, now: float) -> None:
        """Record that `step` steps were done at time `now` (ignored unless it advanced)."""
        if self.samples and step <= self.samples[-1][1]:
            return
        self.samples.append((now, step))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()

    def steps_per_second(self) -> float | None:
        """The rate over the window; None before two observations."""
        if len(self.samples) < 2:
            return None
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None

    def eta(
        self, max_steps: int | None, now: float, step_time_s: float | None = None
    ) -> float | None:
        """Seconds until `max_steps`, counting down from the last observation.

        Uses the observed rate; before there is one, the trainer's own `step_time_s`
        (which leaves out evaluation and checkpoints). None when neither is known.
        """
        if not max_steps or not self.samples:
            return None
        last_time, last_step = self.samples[-1]
        remaining = max(max_steps - last_step, 0)
        rate = self.steps_per_second()
        if rate:
            total = remaining / rate
        elif step_time_s:
            total = remaining * step_time_s
        else:
            return None
        return max(total - (now - last_time), 0.0)


#: Seconds without a heartbeat after which the view warns that the worker may be gone.
STALE_HEARTBEAT_S = 60.0
SCRIPT_METRICS = 3  # a script job's metrics shown beside its loss while it is followed


def heartbeat_silence_s(job: Job, now: datetime) -> float | None:
    """Seconds since the worker last reported on a job it holds (starting, running or
    cancelling); None for other states or before the first heartbeat."""
    if job.state not in ("starting", "running", "cancelling") or job.heartbeat_at is None:
        return None
    beat = job.heartbeat_at
    if beat.tzinfo is None:  # SQLite drops the zone; the server writes UTC
        beat = beat.replace(tzinfo=UTC)
    return max((now - beat).total_seconds(), 0.0)


def _event_line(event: Event) -> Text | None:
    """The line to print for an event, or None for events shown only in the summary."""
    if event.kind == "state":
        text = Text(f"{event.state_from or '-'} -> ")
        text.append(event.state_to or "?", style=STATE_STYLES.get(event.state_to or "", ""))
        if event.message:
            text.append(f"  {event.message}", style="dim")
        return text
    if event.kind == "checkpoint":
        step, uri = event.data.get("step", "?"), event.data.get("uri", "")
        return Text(f"checkpoint step {step}: {uri}", style="dim")
    if event.kind == "error":
        return Text(f"error: {event.message}", style="red")
    if event.kind == "info" and event.message:
        return Text(event.message, style="dim")
    return None


class _View:
    """The progress bar's state, updated item by item."""

    def __init__(self, progress: Progress, job_id: int) -> None:
        self.progress = progress
        self.rate = StepRate()
        self.latest: dict[str, float] = {}
        self.max_steps: int | None = None
        self.step = 0
        self.warned_stale = False
        self.script = False  # a script or eval job reports metrics of its own choosing
        self.headline = headline_metrics("sft")  # (training, evaluation) metric shown
        self.task: TaskID = progress.add_task(
            f"job {job_id}", total=None, loss="loss -", extra="- tok/s", eta="-"
        )

    def on_job(self, job: Job) -> None:
        self.script = job.kind in ("script", "eval")
        self.headline = headline_metrics(job.method)
        self.max_steps = job.max_steps or self.max_steps
        self.progress.update(
            self.task, description=f"{job.name} ({job.state})", total=self.max_steps
        )
        if job.current_step is not None:
            self._advance(job.current_step)

    def on_poll(self, job: Job) -> None:
        """Refresh the ETA; warn once when the worker has gone quiet."""
        self.refresh()
        silence = heartbeat_silence_s(job, datetime.now(UTC))
        if silence is not None and silence > STALE_HEARTBEAT_S and not self.warned_stale:
            self.warned_stale = True
            self.progress.console.print(
                Text(
                    f"no heartbeat from worker {job.worker or '?'} for {silence:.0f} s: it may "
                    "have died (the reconciler, `torchyard beat`, requeues or fails such jobs)",
                    style="yellow",
                )
            )

    def on_event(self, event: Event) -> None:
        if isinstance(event.data.get("max_steps"), int) and not self.max_steps:
            self.max_steps = event.data["max_steps"]
            self.progress.update(self.task, total=self.max_steps)
        if (line := _event_line(event)) is not None:
            self.progress.console.print(line)

    def on_metric(self, point: MetricPoint) -> None:
        self.latest[point.name] = point.value
        if point.name == self.headline[1]:
            said = point.name.replace("_", " ")
            self.progress.console.print(
                f"step {point.step}: {said} {format_value(point.value)}", highlight=False
            )
        self._advance(point.step)

    def _advance(self, step: int) -> None:
        self.step = max(self.step, step)
        self.rate.observe(self.step, time.monotonic())
        self.refresh()

    def refresh(self) -> None:
        eta = self.rate.eta(self.max_steps, time.monotonic(), self.latest.get("step_time_s"))
        self.progress.update(
            self.task,
            completed=self.step,
            loss=f"{self.headline[0]} {format_value(self.latest.get(self.headline[0]))}",
            extra=self._extra(),
            eta=format_duration(eta),
        )

    def _extra(self) -> str:
        """The trainer's throughput; for a script or eval job, the other metrics it reported
        (the first few by name, system series left out)."""
        if not self.script:
            return f"{format_rate(self.latest.get('tokens_per_second'))} tok/s"
        names = sorted(n for n in self.latest if n != "loss" and not n.startswith("sys/"))
        return "  ".join(f"{n} {format_metric(n, self.latest[n])}" for n in names[:SCRIPT_METRICS])


def _columns(job: Job) -> list[ProgressColumn]:
    """The bar's columns: steps, loss, throughput (or a script's metrics) and ETA; an eval job,
    which takes no steps, shows its scores as they arrive and the time it has run."""
    if job.kind == "eval":
        return [
            TextColumn("{task.description}", markup=False),
            TextColumn("{task.fields[extra]}", markup=False),
            TimeElapsedColumn(),
        ]
    return [
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[loss]}"),
        TextColumn("{task.fields[extra]}", markup=False),
        TextColumn("ETA {task.fields[eta]}"),
        TimeElapsedColumn(),
    ]


def follow_job(
    client: Client,
    job_id: int,
    console: Console,
    *,
    poll_s: float = 1.0,
    logs: bool = False,
    check: Callable[[Job], None] | None = None,
) -> JobSummary:
    """Show a job live until it is terminal; return its summary (not printed).

    `check(job)` runs at every poll; raise from it to stop following (e.g. a worker died).
    """
    first = client.jobs.get(job_id)  # fail fast (NotFound) before drawing a progress bar
    events: list[Event] = []
    progress = Progress(*_columns(first), console=console)
    with progress:
        view = _View(progress, job_id)

        def on_poll(job: Job) -> None:
            view.on_poll(job)
            if check is not None:
                check(job)

        for item in client.jobs.follow(job_id, poll_s=poll_s, logs=logs, on_poll=on_poll):
            if isinstance(item, Job):
                view.on_job(item)
            elif isinstance(item, Event):
                events.append(item)
                view.on_event(item)
            elif isinstance(item, MetricPoint):
                view.on_metric(item)
            elif isinstance(item, LogLine):
                progress.console.print(log_line(item), markup=False, highlight=False)
    job = client.jobs.get(job_id)
    series, checkpoints = client.jobs.metrics(job_id), client.jobs.checkpoints(job_id)
    return summarize(job, events, series, checkpoints, fetch_evaluations(client, job))
