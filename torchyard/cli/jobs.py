"""`torchyard submit`, `jobs`, `show`, `cancel`, `pause`, `resume`, `retry`, `label`, `follow`,
`logs`, `checkpoints`, `metrics`: the commands on jobs (merged into the root command by
`torchyard.cli`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from torchyard.cli.common import JsonOpt, command_client, err, out, print_json
from torchyard.client import Client
from torchyard.eval_results import eval_result, fetch_evaluations, score_table
from torchyard.failure_render import failure_block
from torchyard.follow import follow_job
from torchyard.logfilter import compile_grep, parse_since, select
from torchyard.render import (
    checkpoints_table,
    evaluations_table,
    job_details,
    jobs_table,
    log_line,
    metrics_table,
)
from torchyard.specs import apply_overrides, load_spec, set_path, unseen_local_paths
from torchyard.summary import render_summary
from torchyard.types import LogLine

jobs_cli = typer.Typer()

PollOpt = Annotated[
    float,
    typer.Option(
        "--poll",
        help="Seconds between status polls, or before re-opening a dropped live stream.",
        min=0.1,
    ),
]
JobId = Annotated[int, typer.Argument(help="Job id.", metavar="ID")]


def _follow_and_exit(client: Client, job_id: int, poll_s: float, logs: bool = False) -> None:
    summary = follow_job(client, job_id, out, poll_s=poll_s, logs=logs)
    out.print(render_summary(summary))
    raise typer.Exit(0 if summary.succeeded else 1)


@jobs_cli.command()
def submit(
    ctx: typer.Context,
    spec_path: Annotated[str, typer.Argument(metavar="SPEC", help="YAML or JSON file, - stdin.")],
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="Override a field: KEY.PATH=VALUE (repeatable)."),
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Follow until it ends.")] = False,
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Resubmitting returns the same job.")
    ] = None,
    code: Annotated[
        Path | None,
        typer.Option(
            "--code",
            exists=True,
            file_okay=False,
            help="Upload this directory (minus what .gitignore ignores) and run the spec's "
            "entrypoint from it.",
            metavar="DIR",
        ),
    ] = None,
    json_out: JsonOpt = False,
    poll: PollOpt = 1.0,
) -> None:
    """Submit a job from a spec file.

    Example: `torchyard submit spec.yaml --set train.max_steps=500 --follow`
    """
    spec = apply_overrides(load_spec(spec_path), overrides or [])
    for warning in unseen_local_paths(spec):
        err.print(Text(f"warning: {warning}", style="yellow"))
    client = command_client(ctx)
    if code is not None:
        archive = client.code.upload(code)
        if not json_out:
            out.print(Text(f"uploaded {code} as {archive.id} ({archive.num_files} files)"))
        set_path(spec, ["entrypoint", "code"], archive.id)
    job = client.jobs.create(spec, idempotency_key=idempotency_key)
    if json_out:
        if follow:
            job = client.jobs.wait(job.id, poll_s=poll)
        print_json(job)
        raise typer.Exit(0 if job.state == "succeeded" or not follow else 1)
    out.print(Text(f"submitted job {job.id} ({job.name}), state {job.state}"))
    if follow:
        _follow_and_exit(client, job.id, poll)


@jobs_cli.command("jobs")
def list_jobs(
    ctx: typer.Context,
    state: Annotated[
        list[str] | None, typer.Option("--state", help="Only these states (repeatable).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Name contains this.")] = None,
    dataset: Annotated[
        str | None,
        typer.Option("--dataset", help="Only jobs whose spec names this dataset (id or name)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 20,
    json_out: JsonOpt = False,
) -> None:
    """List jobs, newest first.

    Example: `torchyard jobs --state running --state queued`
    """
    jobs = []
    found = command_client(ctx).jobs.iter(
        state=state, name=name, dataset=dataset, page_size=min(limit, 200)
    )
    for job in found:
        jobs.append(job)
        if len(jobs) >= limit:
            break
    if json_out:
        print_json(jobs)
    elif jobs:
        out.print(jobs_table(jobs))
    else:
        out.print("no jobs")


@jobs_cli.command()
def show(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """Show one job; a failed or restarted one starts with why it failed, an eval job with its
    scores and the weights it scored.

    Example: `torchyard show 42`
    """
    client = command_client(ctx)
    job = client.jobs.get(job_id)
    if json_out:
        print_json(job)
        return
    if (why := failure_block(job)) is not None:
        out.print(why)
        out.print()
    if (result := eval_result(job, fetch_evaluations(client, job))) is not None:
        out.print(score_table(result))
        out.print()
    out.print(job_details(job))


@jobs_cli.command()
def cancel(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """Cancel a job (any state but a terminal one).

    Example: `torchyard cancel 42`
    """
    job = command_client(ctx).jobs.cancel(job_id)
    if json_out:
        print_json(job)
    else:
        out.print(Text(f"job {job.id}: {job.state}"))


@jobs_cli.command()
def pause(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """Pause a job: a running one checkpoints and stops; `torchyard resume` continues it.

    Example: `torchyard pause 42`
    """
    _print_job_state(command_client(ctx).jobs.pause(job_id), json_out)


@jobs_cli.command()
def resume(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """Resume a paused job from its latest checkpoint.

    Example: `torchyard resume 42`
    """
    _print_job_state(command_client(ctx).jobs.resume(job_id), json_out)


@jobs_cli.command()
def retry(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """Run a failed or cancelled job again from its latest checkpoint.

    Example: `torchyard retry 42`
    """
    _print_job_state(command_client(ctx).jobs.retry(job_id), json_out)


@jobs_cli.command()
def label(
    ctx: typer.Context,
    job_id: JobId,
    pairs: Annotated[
        list[str] | None,
        typer.Argument(
            help="The job's labels as KEY=VALUE, replacing all it had (none: keep them).",
            metavar="KEY=VALUE...",
        ),
    ] = None,
    note: Annotated[
        str | None,
        typer.Option(
            "--note", help='A free-text note about the job ("" clears it).', metavar="TEXT"
        ),
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove every label.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Set a job's labels (replacing the set) and/or its note, in any state.

    Example: `torchyard label 42 team=nlp baseline=yes --note "best lr so far"`
    """
    labels: dict[str, str] | None = {} if clear else None
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="KEY=VALUE")
        labels = {**(labels or {}), key: value}
    if labels is None and note is None:
        raise typer.BadParameter("give KEY=VALUE labels, --clear or --note")
    job = command_client(ctx).jobs.update(job_id, labels=labels, note=note)
    if json_out:
        print_json(job)
        return
    shown = " ".join(f"{k}={v}" for k, v in job.labels.items()) or "(no labels)"
    out.print(Text(f"job {job.id}: {shown}" + (f"\nnote: {job.note}" if job.note else "")))


def _print_job_state(job: Any, json_out: bool) -> None:
    if json_out:
        print_json(job)
    else:
        out.print(Text(f"job {job.id}: {job.state}"))


@jobs_cli.command()
def follow(
    ctx: typer.Context,
    job_id: JobId,
    logs: Annotated[bool, typer.Option("--logs", help="Also print log lines.")] = False,
    poll: PollOpt = 1.0,
) -> None:
    """Follow a job live until it ends; exit 1 unless it succeeded.

    Example: `torchyard follow 42 --logs`
    """
    _follow_and_exit(command_client(ctx), job_id, poll, logs=logs)


@jobs_cli.command()
def logs(
    ctx: typer.Context,
    job_id: JobId,
    rank: Annotated[int | None, typer.Option("--rank", help="Only this rank (-1: launcher).")] = (
        None
    ),
    grep: Annotated[
        str | None,
        typer.Option(
            "--grep",
            help="Only lines matching this regular expression (Python re).",
            metavar="REGEX",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Only lines from this long ago (90s, 10m, 2h, 1d) or after "
            "this time (ISO 8601, UTC).",
            metavar="WHEN",
        ),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines as they arrive.")
    ] = False,
    poll: PollOpt = 1.0,
) -> None:
    """Print a job's log lines, one `\\[rank N]` prefix each.

    Example: `torchyard logs 42 --rank 0 --grep 'loss|Error' --since 10m --follow`
    """
    try:
        pattern = compile_grep(grep) if grep is not None else None
        start = parse_since(since) if since is not None else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    jobs = command_client(ctx).jobs
    if follow:
        items = jobs.follow(job_id, poll_s=poll, events=False, metrics=False, logs=True, rank=rank)
        lines: Iterator[LogLine] = (item for item in items if isinstance(item, LogLine))
    else:
        lines = jobs.iter_logs(job_id, rank=rank)
    for line in select(lines, grep=pattern, since=start):
        typer.echo(log_line(line))


@jobs_cli.command()
def checkpoints(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """List a job's complete checkpoints with their ids and export state.

    Example: `torchyard checkpoints 42 --json`
    """
    items = command_client(ctx).jobs.checkpoints(job_id)
    if json_out:
        print_json(items)
    else:
        out.print(checkpoints_table(items) if items else "no checkpoints")


@jobs_cli.command()
def evals(
    ctx: typer.Context,
    job_id: JobId,
    answers: Annotated[
        bool,
        typer.Option(
            "--answers", help="Also print each `generate` answer and `reward` completion."
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """List a job's evaluations: the ones an eval job ran, or the ones run on a training job's
    checkpoints (submit an eval job with `evaluate` in its spec).

    Example: `torchyard evals 42 --answers`
    """
    items = command_client(ctx).jobs.evals(job_id)
    if json_out:
        print_json(items)
        return
    out.print(evaluations_table(items) if items else "no evaluations")
    for found in items if answers else []:
        for sample in found.samples:
            out.print(f"[bold]{found.name}[/bold] prompt: {sample.get('prompt', '')!r}")
            if found.kind == "reward":
                out.print(f"  completion: {sample.get('completion', '')!r}")
                out.print(f"  reward:     {sample.get('reward')}  scores: {sample.get('scores')}")
                continue
            out.print(f"  reference: {sample.get('reference', '')!r}")
            out.print(f"  answer:    {sample.get('answer', '')!r}")


@jobs_cli.command()
def metrics(
    ctx: typer.Context,
    job_id: JobId,
    names: Annotated[
        list[str] | None, typer.Option("--name", help="Only this metric (repeatable).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Show a job's metrics (last, min, max per metric; --json: every point).

    Example: `torchyard metrics 42 --name loss --name eval_loss`
    """
    series = command_client(ctx).jobs.metrics(job_id, names=names)
    if json_out:
        print_json(series)
    else:
        out.print(metrics_table(series) if series else "no metrics")
