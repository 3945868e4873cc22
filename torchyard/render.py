"""Human-readable output of the CLI: rich tables and number formatting.

Pure functions from SDK answers (`torchyard.types`) to `rich` renderables; user-supplied text
(names, log lines, error messages) is wrapped in `Text` so square brackets in it are never read
as markup.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from datetime import UTC, datetime

from rich.table import Table
from rich.text import Text

from torchyard.errors import ApiError, TorchyardError, ValidationFailed
from torchyard.failure_render import state_with_class
from torchyard.tables import Column, ListTable
from torchyard.types import (
    Checkpoint,
    CheckpointExport,
    Dataset,
    DatasetFile,
    DatasetPreview,
    DatasetSample,
    DatasetStats,
    Entrypoint,
    Evaluation,
    Job,
    Lengths,
    LogLine,
    MetricSeries,
    PreviewExample,
)
from torchyard.units import (
    format_age,
    format_bytes,
    format_duration,
    format_metric,
    format_value,
    format_when,
)

STATE_STYLES = {
    "queued": "cyan",
    "starting": "cyan",
    "running": "blue",
    "paused": "yellow",
    "preempting": "yellow",
    "restarting": "yellow",
    "cancelling": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def trained_text(job: Job) -> str:
    """How long the job trained (`running_s`, all attempts), and the span from its start to its
    end when that is longer: starting, restarts and the final save are not training.
    ``3m38s of 3m51s from start to end``. The dashboard's `trainedText` says the same."""
    trained = format_duration(job.running_s)
    if job.started_at is None or job.finished_at is None or job.running_s is None:
        return trained
    span = (job.finished_at - job.started_at).total_seconds()
    if round(span) - round(job.running_s) < 1:
        return trained
    return f"{trained} of {format_duration(span)} from start to end"


def state_text(state: str) -> Text:
    """The state, coloured."""
    return Text(state, style=STATE_STYLES.get(state, ""))


def step_text(job: Job) -> str:
    """``120/600``, ``120`` (no known end: a script job's) or ``-`` (none reported, no end)."""
    if job.current_step is None:
        return f"0/{job.max_steps}" if job.max_steps else "-"
    return f"{job.current_step}/{job.max_steps}" if job.max_steps else str(job.current_step)


def queue_text(job: Job, now: datetime | None = None) -> str:
    """A waiting job's place, reason and estimated start: ``#3 quota gpus 2/2, starts in
    ~5m00s``; ``-`` when it does not wait."""
    queue = job.queue
    if queue is None:
        return "-"
    text = f"#{queue.position} {queue.reason}" if queue.position else queue.reason
    start = queue.estimated_start_at
    if start is not None:
        now = now or datetime.now(UTC)
        if start.tzinfo is None:
            start = start.replace(tzinfo=UTC)
        text += f", starts in ~{format_duration(max(0.0, (start - now).total_seconds()))}"
    return text


def command_line(entrypoint: Entrypoint) -> str:
    """A script job's `command` as one shell line (``python train.py --lr 3e-4``), quoted
    where an argument needs it."""
    return shlex.join(entrypoint.command)


def jobs_table(jobs: Iterable[Job], now: datetime | None = None) -> ListTable:
    """One row per job: id, name, state (with the latest failure's class), step, loss, kind
    (``trainer``, ``script`` or ``eval``), pool, age, and for a waiting job its place, reason and
    estimated start (`queue_text`). On a narrow terminal the pool goes first, then kind, created,
    loss and step; the queue is cut at its end, the name in its middle, the id never."""
    table = ListTable(
        Column("ID", "num"),
        Column("NAME", "name"),
        Column("STATE", "id"),
        Column("STEP", "num", drop=5),
        Column("LOSS", "num", drop=4),
        Column("KIND", "id", drop=2),
        Column("POOL", "text", drop=1),
        Column("CREATED", "id", drop=3),
        Column("QUEUE", "text"),
    )
    for job in jobs:
        table.add_row(
            str(job.id),
            Text(job.name),
            state_with_class(job, STATE_STYLES.get(job.state, "")),
            step_text(job),
            format_value(job.latest_metrics.get("loss")),
            job.kind,
            Text(job.pool or "-"),
            format_age(job.created_at, now),
            Text(queue_text(job, now)),
        )
    return table


def entrypoint_rows(entrypoint: Entrypoint) -> list[tuple[str, Text | str]]:
    """A script job's code archive, command (one shell line), env (``NAME=value``, one per
    line), requirements and checkpoint retention, as key/value rows."""
    rows: list[tuple[str, Text | str]] = [
        ("code", Text(entrypoint.code)),
        ("command", Text(command_line(entrypoint))),
    ]
    if entrypoint.env:
        env = "\n".join(f"{k}={shlex.quote(v)}" for k, v in sorted(entrypoint.env.items()))
        rows.append(("env", Text(env)))
    if entrypoint.requirements:
        rows.append(("requirements", Text(", ".join(entrypoint.requirements))))
    if entrypoint.keep_last_checkpoints is not None:
        rows.append(("keep checkpoints", f"last {entrypoint.keep_last_checkpoints}"))
    return rows


def job_details(job: Job) -> Table:
    """Two-column key/value view of one job; a script job's shows its command and code; an eval
    job, which trains nothing, says how long it ran."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, Text | str]] = [
        ("id", str(job.id)),
        ("name", Text(job.name)),
        ("kind", job.kind),
        ("state", state_text(job.state)),
        ("attempt", str(job.attempt)),
        # an eval job takes no steps: `show` prints the step it scored above (`eval_results`)
        *([] if job.kind == "eval" else [("step", step_text(job))]),
        ("pool", Text(job.pool or "-")),
        *([("queue", Text(queue_text(job)))] if job.queue is not None else []),
        ("worker", Text(job.worker or "-")),
        ("created", format_when(job.created_at)),
        ("started", format_when(job.started_at)),
        ("finished", format_when(job.finished_at)),
        ("ran" if job.kind == "eval" else "trained", trained_text(job)),
    ]
    if job.eta_s is not None:
        rows.append(("eta", format_duration(job.eta_s)))
    if (entrypoint := job.entrypoint) is not None:
        rows += entrypoint_rows(entrypoint)
    if job.labels:
        rows.append(("labels", Text(", ".join(f"{k}={v}" for k, v in job.labels.items()))))
    for name, metric in sorted(job.latest_metrics.items()):
        rows.append((name, format_metric(name, metric)))
    if job.exit_code is not None:
        rows.append(("exit code", str(job.exit_code)))
    if job.failure is None and job.error:  # else `failure_render.failure_block` showed it
        rows.append(("error", Text(job.error, style="red")))
    if job.failure is None and job.restarts_used and job.retry_policy is not None:
        rows.append(("restarts", Text(job.retry_policy.summary)))
    if (used := job.usage) is not None and used.slot_seconds:
        rows.append(
            (
                "usage",
                f"{used.slot_seconds / 3600:.2f} slot-hours, "
                f"{used.cpu_seconds / 3600:.2f} CPU-hours, cost {used.cost:.2f}",
            )
        )
    for key, value in rows:
        table.add_row(key, value)
    return table


def checkpoints_table(checkpoints: Iterable[Checkpoint]) -> ListTable:
    """One row per checkpoint: id (for `torchyard export`), step, attempt, size, export state
    (and the export's size once ready), uri (whole, under the row when it does not fit)."""
    table = ListTable(
        Column("ID", "num"),
        Column("STEP", "num"),
        Column("ATTEMPT", "num", drop=1),
        Column("SIZE", "num", drop=2),
        Column("EXPORT", "id"),
        Column("URI", "long"),
    )
    for cp in sorted(checkpoints, key=lambda c: c.step):
        table.add_row(
            str(cp.id),
            str(cp.step),
            str(cp.attempt),
            format_bytes(cp.size_bytes),
            export_state(cp.export),
            Text(cp.uri),
        )
    return table


def evaluations_table(evaluations: Iterable[Evaluation]) -> ListTable:
    """One row per evaluation: the eval job, the evaluated job and step (`base`: its starting
    weights, no checkpoint), the evaluation's name, kind and dataset, and its scores (whole,
    under the row when they do not fit)."""
    table = ListTable(
        Column("EVAL JOB", "num"),
        Column("JOB", "num"),
        Column("STEP", "num"),
        Column("NAME", "name"),
        Column("KIND", "id", drop=2),
        Column("DATASET", "id", drop=1),  # an id or a name: whole, or not at all
        Column("SCORES", "long"),
    )
    for found in evaluations:
        scores = "  ".join(f"{k} {format_value(v)}" for k, v in found.metrics.items())
        table.add_row(
            str(found.job_id),
            str(found.source_job_id),
            "base" if found.checkpoint_id is None and found.step == 0 else str(found.step),
            Text(found.name),
            found.kind,
            Text(found.dataset or "(own eval split)"),
            scores,
        )
    return table


def export_state(export: CheckpointExport | None) -> Text:
    """``-`` (none asked for), the state, ``ready (SIZE)`` in green, ``failed`` in red."""
    if export is None:
        return Text("-")
    if export.state == "ready":
        return Text(f"ready ({format_bytes(export.size_bytes)})", style="green")
    return Text(export.state, style="red" if export.state == "failed" else "yellow")


def metrics_table(series: Iterable[MetricSeries]) -> ListTable:
    """One row per metric: points, last step, last, min and max value, in the metric's unit
    (`format_metric`)."""
    table = ListTable(
        Column("METRIC", "name"),
        Column("POINTS", "num", drop=1),
        Column("LAST STEP", "num", drop=4),
        Column("LAST", "num"),
        Column("MIN", "num", drop=2),
        Column("MAX", "num", drop=3),
    )
    for s in sorted(series, key=lambda s: s.name):
        last = s.last or (s.points()[-1] if s.values else None)
        table.add_row(
            Text(s.name),
            str(len(s.values)),
            str(last.step) if last else "-",
            format_metric(s.name, last.value if last else None),
            format_metric(s.name, min(s.values) if s.values else None),
            format_metric(s.name, max(s.values) if s.values else None),
        )
    return table


def datasets_table(datasets: Iterable[Dataset], now: datetime | None = None) -> ListTable:
    """One row per dataset: id (whole: `data.dataset` takes it), name, format, records, size,
    files, age, uri (whole, under the row when it does not fit). Files, then created, format
    and records go first on a narrow terminal."""
    table = ListTable(
        Column("ID", "id"),
        Column("NAME", "name"),
        Column("FORMAT", "id", drop=3),
        Column("RECORDS", "num", drop=4),
        Column("SIZE", "num", drop=5),
        Column("FILES", "num", drop=1),
        Column("CREATED", "id", drop=2),
        Column("URI", "long"),
    )
    for ds in datasets:
        table.add_row(
            Text(ds.id),
            Text(ds.name),
            ds.format,
            "-" if ds.stats is None else format_value(ds.stats.records),
            format_bytes(ds.size_bytes),
            "-" if ds.num_files is None else format_value(ds.num_files),
            format_age(ds.created_at, now),
            Text(ds.uri),
        )
    return table


def dataset_files_table(files: Iterable[DatasetFile]) -> ListTable:
    """One row per file: its size, its path in the dataset (whole, under the size when it does
    not fit)."""
    table = ListTable(Column("SIZE", "num"), Column("PATH", "long"))
    for f in files:
        table.add_row(format_bytes(f.size_bytes), Text(f.path))
    return table


def sample_records(sample: DatasetSample) -> list[Text]:
    """Each sampled record under a bold `where` line: a text head as it is, a JSON record or
    token ids as indented JSON; `(cut)` when a long value was shortened."""
    shown = []
    for item in sample.items:
        body = item.record if isinstance(item.record, str) else json.dumps(item.record, indent=2)
        head = Text(item.where, style="bold")
        if item.truncated:
            head.append("  (cut)", style="yellow")
        shown.append(Text.assemble(head, "\n", Text(body)))
    return shown


def dataset_stats_table(stats: DatasetStats) -> Table:
    """The stats of one dataset as `name  value` rows: counts, length percentiles (p50 / p90
    / p99 / max), messages per role, warnings."""
    table = Table(box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("records", format_value(stats.records))
    table.add_row("bytes", format_bytes(stats.bytes))
    table.add_row("duplicates", format_value(stats.duplicates))
    for part, lengths in (stats.chars or {}).items():
        table.add_row(f"chars ({part})", _percentiles(lengths))
    if stats.tokens is not None:
        table.add_row("tokens per record", _percentiles(stats.tokens))
    for name in ("num_tokens", "supervised_tokens"):
        if (value := getattr(stats, name)) is not None:
            table.add_row(name.replace("_", " "), format_value(value))
    for name in ("max_token_id", "token_dtype"):  # an id and a dtype: as they are
        if (value := getattr(stats, name)) is not None:
            table.add_row(name.replace("_", " "), str(value))
    if stats.roles:
        table.add_row("messages", ", ".join(f"{r} {n}" for r, n in sorted(stats.roles.items())))
    for w in stats.warnings:
        table.add_row(Text("warning", style="yellow"), f"{w.message}: {w.count} (first {w.first})")
    return table


SUPERVISED_STYLE = "black on green"


def preview_tokens(example: PreviewExample) -> Text:
    """The example's text token by token: supervised tokens (targets of the loss) on a green
    background, the rest plain; one header line names the record and counts its tokens."""
    supervised = sum(example.supervised)
    shown = len(example.tokens)
    cut = f" (first {shown} shown)" if example.num_tokens > shown else ""
    text = Text()
    text.append(
        f"{example.where}  {example.status}, {example.num_tokens} tokens{cut}, "
        f"{supervised} supervised\n",
        style="bold",
    )
    for piece, bit in zip(example.tokens, example.supervised, strict=True):
        text.append(piece, style=SUPERVISED_STYLE if bit else "")
    return text


def preview_report(preview: DatasetPreview) -> Table:
    """Per role: tokens, supervised tokens and the role's share of all supervised tokens,
    titled with the tokenizer, loss_on and seq_len, captioned with the truncation counts."""
    report = preview.report
    title = f"{preview.tokenizer}, loss_on {preview.loss_on}, seq_len {preview.seq_len}"
    table = Table(title=title)
    for column in ("role", "tokens", "supervised", "share"):
        table.add_column(column, justify="left" if column == "role" else "right")
    for role in sorted(report.tokens_by_role):
        share = report.supervised_share_by_role.get(role, 0.0)
        table.add_row(
            role,
            str(report.tokens_by_role[role]),
            str(report.supervised_by_role.get(role, 0)),
            f"{share:.1%}",
        )
    table.caption = (
        f"{report.examples} examples, {report.dropped} dropped, {report.truncated} truncated, "
        f"{report.lost_all_supervision} lost all supervision"
    )
    return table


def preview_verdict(preview: DatasetPreview) -> Text:
    """`verdict: ok` in green, or the refusal a job would get, in red."""
    if preview.refused is None:
        return Text("verdict: ok", style="green")
    return Text(f"verdict: refused: {preview.refused}", style="red")


def _percentiles(lengths: Lengths) -> str:
    return f"p50 {lengths.p50} / p90 {lengths.p90} / p99 {lengths.p99} / max {lengths.max}"


def log_line(line: LogLine) -> str:
    """``[rank 0] text`` (``[launcher]`` for rank -1), plain text for the terminal. The rank
    prefix a process wrote itself (``[rank0]``, torchrun's ``[rank0]:``) is dropped, so each
    line shows one."""
    if line.rank < 0:
        return f"[launcher] {line.line}"
    own = re.match(rf"\[rank ?{line.rank}\]:? ?", line.line)
    return f"[rank {line.rank}] {line.line[own.end() if own else 0 :]}"


_PLACED = re.compile(r"(line|row) \d+: ")


def error_lines(exc: TorchyardError) -> list[str]:
    """What to tell the user about an error, one line each: the message, then for a 422 each
    bad field as ``path: message``."""
    if not isinstance(exc, ApiError):
        return [str(exc)]
    head = f"{exc.message} ({exc.status} {exc.code})"
    if exc.details and all(_PLACED.match(d.msg) for d in exc.details):
        # A refused dataset: each detail names its line or row and field path already.
        return [head, *(f"  {d.msg}" for d in exc.details)]
    if any(d.msg and d.msg in exc.message for d in exc.details):
        # The message only repeats a detail (FastAPI-style "invalid request: body.x: ...").
        what = "invalid request" if isinstance(exc, ValidationFailed) else "request rejected"
        head = f"{what} ({exc.status} {exc.code}):"
    return [head, *(f"  {d.path}: {d.msg}" for d in exc.details)]
