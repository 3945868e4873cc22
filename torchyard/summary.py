"""The end-of-run summary of a job: losses, baseline, throughput, checkpoint and text sample.

`summarize` is pure (models in, dataclass out) so it is tested without a server. It prefers
the trainer's own final report (the ``completed`` status data, see docs/CONTRACTS.md section 2,
as carried in an event's `data`) and falls back to the metric series. A script job (section 5)
reports metrics of its own choosing: its summary lists those instead of the trainer's figures.
An eval job (`evaluate`) leads with its scores, the weights it scored and the baseline beside
them (`torchyard.eval_results`): it trains nothing and writes no checkpoint.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from torchyard.eval_results import EvalResult, eval_result, score_rows
from torchyard.render import command_line, state_text
from torchyard.tables import WholeLine
from torchyard.types import Checkpoint, Evaluation, Event, Job, MetricSeries
from torchyard.units import format_duration, format_metric, format_rate, format_value


@dataclass(frozen=True)
class JobSummary:
    """What a finished (or interrupted) run amounted to. Losses in nats per token (byte)."""

    job_id: int
    name: str
    state: str
    step: int | None
    max_steps: int | None
    final_loss: float | None
    final_eval_loss: float | None
    unigram_eval_loss: float | None
    tokens_per_second: float | None
    checkpoint_uri: str | None
    sample_prompt: str | None
    sample_text: str | None
    duration_s: float | None
    error: str | None
    kind: str = "trainer"  # "script": the user's own code (`entrypoint`); "eval": `evaluate`
    command: str | None = None  # a script job's command, one shell line
    # The last value of each metric the job reported (None: not finite), for a script job's
    # summary, whose metric names are its own.
    metrics: dict[str, float | None] = field(default_factory=dict)
    evaluation: EvalResult | None = None  # an eval job's scores, source and baseline
    method: str = "sft"  # the built-in trainer's method.kind: GRPO is read by its rewards
    # GRPO: the held-out reward at the first evaluation, and that evaluation's step
    first_eval_reward: tuple[int, float] | None = None

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"


def _latest_data(events: Sequence[Event], key: str) -> Any:
    """`data[key]` of the newest event that has it, else None."""
    for event in reversed(events):
        if event.data.get(key) is not None:
            return event.data[key]
    return None


def _last(series: dict[str, MetricSeries], name: str) -> float | None:
    s = series.get(name)
    return s.values[-1] if s and s.values else None


def _median(series: dict[str, MetricSeries], name: str) -> float | None:
    s = series.get(name)
    return statistics.median(s.values) if s and s.values else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _trained_seconds(job: Job) -> float | None:
    """The server's `running_s` (every attempt); from an older server, the wall time."""
    if job.running_s is not None:
        return job.running_s
    if job.started_at and job.finished_at:
        return (job.finished_at - job.started_at).total_seconds()
    return None


def summarize(
    job: Job,
    events: Sequence[Event],
    series: Iterable[MetricSeries],
    checkpoints: Iterable[Checkpoint],
    evaluations: Iterable[Evaluation] = (),
) -> JobSummary:
    """Combine a job's final record, events, metrics and checkpoints into one summary; for an
    eval job, `evaluations` are its source job's (`torchyard.eval_results.fetch_evaluations`)."""
    by_name = {s.name: s for s in series}
    samples = [e for e in events if e.kind == "sample"]
    errors = [e for e in events if e.kind == "error" and e.message]
    latest_cp = max(checkpoints, key=lambda c: c.step, default=None)
    final_loss = _float(_latest_data(events, "final_loss"))
    final_eval = _float(_latest_data(events, "final_eval_loss"))
    tokens = _float(_latest_data(events, "tokens_per_second"))
    return JobSummary(
        job_id=job.id,
        name=job.name,
        state=job.state,
        step=job.current_step,
        max_steps=job.max_steps,
        final_loss=final_loss if final_loss is not None else _last(by_name, "loss"),
        final_eval_loss=final_eval if final_eval is not None else _last(by_name, "eval_loss"),
        unigram_eval_loss=_float(_latest_data(events, "unigram_eval_loss")),
        tokens_per_second=tokens if tokens is not None else _median(by_name, "tokens_per_second"),
        # An admin's key sees where the checkpoint is on the server (quickstart's own key).
        checkpoint_uri=(latest_cp.server_uri or latest_cp.uri)
        if latest_cp
        else _latest_data(events, "checkpoint_uri"),
        sample_prompt=samples[-1].data.get("prompt") if samples else None,
        sample_text=samples[-1].data.get("text") if samples else None,
        duration_s=_trained_seconds(job),
        error=job.error or (errors[-1].message if errors else None),
        kind=job.kind,
        command=command_line(job.entrypoint) if job.entrypoint is not None else None,
        metrics={
            **{name: s.values[-1] for name, s in by_name.items() if s.values},
            **job.latest_metrics,
        },
        evaluation=_evaluation(job, evaluations, by_name),
        method=job.method,
        first_eval_reward=_first(by_name, "eval_reward"),
    )


def _first(series: dict[str, MetricSeries], name: str) -> tuple[int, float] | None:
    s = series.get(name)
    return (s.steps[0], s.values[0]) if s and s.values and s.values[0] is not None else None


def _evaluation(
    job: Job, evaluations: Iterable[Evaluation], series: dict[str, MetricSeries]
) -> EvalResult | None:
    """An eval job's result; its scores from its metric series when the evals API gave none
    (the source job deleted since)."""
    result = eval_result(job, evaluations)
    if result is None or result.scores:
        return result
    scores = {name: s.values[-1] for name, s in series.items() if "." in name and s.values}
    return replace(result, scores=scores)


Row = tuple[str | Text, Text | str]


def _figures(summary: JobSummary) -> list[Row]:
    """The trainer's losses, baseline and throughput; a script job's own last metrics."""
    if summary.kind == "script":
        rows: list[Row] = [("command", Text(summary.command or "-"))]
        rows += [(Text(k), format_metric(k, v)) for k, v in sorted(summary.metrics.items())]
        return rows
    if summary.method == "grpo":
        return [*_reward_rows(summary), ("tokens/s", format_rate(summary.tokens_per_second))]
    rows = [
        ("train loss", format_value(summary.final_loss)),
        ("eval loss", format_value(summary.final_eval_loss)),
    ]
    if summary.unigram_eval_loss is not None:
        rows.append(("unigram baseline", f"{format_value(summary.unigram_eval_loss)} (eval)"))
    rows.append(("tokens/s", format_rate(summary.tokens_per_second)))
    return rows


def _reward_rows(summary: JobSummary) -> list[Row]:
    """A GRPO job's figures: its last training reward (the step's completions, graded) and its
    held-out reward (greedy answers) with the first evaluation's beside it."""
    held = format_value(summary.metrics.get("eval_reward"))
    if summary.first_eval_reward is not None:
        step, value = summary.first_eval_reward
        held += f" ({format_value(value)} at step {step})"
    return [("reward", format_value(summary.metrics.get("reward"))), ("eval reward", held)]


def render_summary(summary: JobSummary) -> RenderableType:
    """A table of the figures, then the text sample in a panel when there is one."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    if summary.evaluation is not None:
        return _render_eval(table, summary, summary.evaluation)
    steps = "-" if summary.step is None else str(summary.step)
    if summary.max_steps:
        steps += f"/{summary.max_steps}"
    rows: list[Row] = [
        ("job", Text(f"{summary.job_id} ({summary.name})")),
        ("state", state_text(summary.state)),
        ("steps", steps),
        *_figures(summary),
        ("duration", format_duration(summary.duration_s)),
    ]
    if summary.error:
        rows.append(("error", Text(summary.error, style="red")))
    for key, value in rows:
        table.add_row(key, value)
    # Last, on a line of its own that is never split: the path is what a user copies next.
    key_width = max(cell_len(str(key)) for key, _ in [*rows, ("checkpoint", "")])
    checkpoint = Text(f"{'checkpoint':<{key_width}}  ", style="bold")
    parts: list[RenderableType] = [table, WholeLine(checkpoint + (summary.checkpoint_uri or "-"))]
    if summary.sample_text is not None:
        sample = Text(summary.sample_prompt or "", style="bold")
        sample.append(summary.sample_text)
        parts.append(Panel(sample, title="sample", title_align="left"))
    return Group(*parts)


def _render_eval(table: Table, summary: JobSummary, result: EvalResult) -> Table:
    """An eval job's summary: its scores first, then the weights scored and how long it ran;
    no steps, losses, throughput or checkpoint (it trains nothing)."""
    rows: list[Row] = [
        ("job", Text(f"{summary.job_id} ({summary.name}), eval")),
        ("state", state_text(summary.state)),
        *score_rows(result),
        ("ran", format_duration(summary.duration_s)),
    ]
    if summary.error:
        rows.append(("error", Text(summary.error, style="red")))
    for key, value in rows:
        table.add_row(key, value)
    return table
