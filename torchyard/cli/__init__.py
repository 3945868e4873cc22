"""The ``torchyard`` command line: submit and watch jobs, manage datasets, run the servers.

Tables for people by default, ``--json`` for scripts. Any API error is printed in red (a 422
with one ``path: message`` line per bad field) and exits with status 1; following a job exits
with 1 unless it succeeded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import BaseModel
from rich.text import Text
from typer.core import TyperArgument, TyperGroup, TyperOption

from torchyard import launch
from torchyard.cli.access import keys_app, members_app
from torchyard.cli.code import code_app
from torchyard.cli.common import JsonOpt, command_client, err, out
from torchyard.cli.exports import export_command
from torchyard.cli.usage import usage_command
from torchyard.client import Client
from torchyard.config import save_config
from torchyard.errors import TorchyardError
from torchyard.failures import failure_block
from torchyard.follow import follow_job
from torchyard.logfilter import compile_grep, parse_since, select
from torchyard.models import DATASET_FORMATS, Dataset, LogLine
from torchyard.quickstart import quickstart_command
from torchyard.render import (
    checkpoints_table,
    dataset_stats_table,
    datasets_table,
    error_lines,
    job_details,
    jobs_table,
    log_line,
    metrics_table,
    preview_report,
    preview_tokens,
    preview_verdict,
)
from torchyard.specs import SpecFileError, apply_overrides, load_spec, set_path
from torchyard.summary import render_summary

if TYPE_CHECKING:
    # typer >= 0.2x vendors click; its groups get this Context, not `click.Context` (click is
    # no longer a dependency of typer).
    from typer._click.core import Context as ClickContext


class _Group(TyperGroup):
    """Turns SDK errors into a red message and exit status 1 for every command, and names each
    value in help by what it is (`KEY`, `SPEC`), not by Python type placeholders (`<str>`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _tidy_help(self)

    def invoke(self, ctx: ClickContext) -> Any:
        try:
            return super().invoke(ctx)
        except (TorchyardError, SpecFileError) as exc:
            lines = error_lines(exc) if isinstance(exc, TorchyardError) else [str(exc)]
            err.print(Text(f"error: {lines[0]}", style="red"))
            for line in lines[1:]:
                err.print(Text(line, style="red"))
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print(Text("interrupted", style="yellow"))
            raise typer.Exit(130) from None


def _tidy_help(command: Any) -> None:
    """Help without type placeholders: a flag shows no value, an option its name in capitals
    (or the metavar it was given), an argument its metavar alone. Walks sub-commands."""
    for param in command.params:
        if isinstance(param, TyperOption):
            if param.is_flag:
                param.metavar = ""
            elif param.metavar is None:
                desc = param.type_descriptor
                choices = desc.choices if desc.is_choice else None
                # A choice shows its values (`gpt|chat-sft|dpo`), any other value its name.
                param.metavar = (
                    "|".join(map(str, choices)) if choices else (param.name or "value").upper()
                )
        elif isinstance(param, TyperArgument):
            param.metavar = param.metavar or (param.name or "value").upper()
            param.display_type_rich = lambda ctx: None  # type: ignore[method-assign] # the metavar says it
    plain_help = command.get_help_option

    def get_help_option(ctx: ClickContext) -> Any:
        option = plain_help(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        _tidy_help(sub)


app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    help="Torchyard: submit PyTorch training jobs and follow them.",
)
datasets_app = typer.Typer(no_args_is_help=True, help="Training text of the project.")
admin_app = typer.Typer(no_args_is_help=True, help="Database administration (server side).")
app.add_typer(datasets_app, name="datasets")
app.add_typer(admin_app, name="admin")
app.add_typer(code_app, name="code")
app.add_typer(keys_app, name="keys")
app.add_typer(members_app, name="members")
app.command("quickstart")(quickstart_command)
app.command("export")(export_command)
app.command("usage")(usage_command)

PollOpt = Annotated[
    float,
    typer.Option(
        "--poll",
        help="Seconds between status polls, or before re-opening a dropped live stream.",
        min=0.1,
    ),
]
JobId = Annotated[int, typer.Argument(help="Job id.", metavar="ID")]


@app.callback()
def _root(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option("--url", help="API base URL (default: $TORCHYARD_URL, then login)."),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", help="API key (default: $TORCHYARD_API_KEY, then login)."),
    ] = None,
) -> None:
    ctx.obj = {"url": url, "api_key": api_key}


def _print_json(data: Any) -> None:
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    elif isinstance(data, list):
        data = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    typer.echo(json.dumps(data, indent=2, default=str))


def _follow_and_exit(client: Client, job_id: int, poll_s: float, logs: bool = False) -> None:
    summary = follow_job(client, job_id, out, poll_s=poll_s, logs=logs)
    out.print(render_summary(summary))
    raise typer.Exit(0 if summary.succeeded else 1)


@app.command()
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
        _print_json(job)
        raise typer.Exit(0 if job.state == "succeeded" or not follow else 1)
    out.print(Text(f"submitted job {job.id} ({job.name}), state {job.state}"))
    if follow:
        _follow_and_exit(client, job.id, poll)


@app.command("jobs")
def list_jobs(
    ctx: typer.Context,
    state: Annotated[
        list[str] | None, typer.Option("--state", help="Only these states (repeatable).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Name contains this.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 20,
    json_out: JsonOpt = False,
) -> None:
    """List jobs, newest first.

    Example: `torchyard jobs --state running --state queued`
    """
    jobs = []
    for job in command_client(ctx).jobs.iter(state=state, name=name, page_size=min(limit, 200)):
        jobs.append(job)
        if len(jobs) >= limit:
            break
    if json_out:
        _print_json(jobs)
    elif jobs:
        out.print(jobs_table(jobs))
    else:
        out.print("no jobs")


@app.command()
def show(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """Show one job; a failed or restarted one starts with why it failed.

    Example: `torchyard show 42`
    """
    job = command_client(ctx).jobs.get(job_id)
    if json_out:
        _print_json(job)
        return
    if (why := failure_block(job)) is not None:
        out.print(why)
        out.print()
    out.print(job_details(job))


@app.command()
def cancel(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """Cancel a job (any state but a terminal one).

    Example: `torchyard cancel 42`
    """
    job = command_client(ctx).jobs.cancel(job_id)
    if json_out:
        _print_json(job)
    else:
        out.print(Text(f"job {job.id}: {job.state}"))


@app.command()
def pause(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """Pause a job: a running one checkpoints and stops; `torchyard resume` continues it.

    Example: `torchyard pause 42`
    """
    _print_job_state(command_client(ctx).jobs.pause(job_id), json_out)


@app.command()
def resume(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """Resume a paused job from its latest checkpoint.

    Example: `torchyard resume 42`
    """
    _print_job_state(command_client(ctx).jobs.resume(job_id), json_out)


@app.command()
def retry(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """Run a failed or cancelled job again from its latest checkpoint.

    Example: `torchyard retry 42`
    """
    _print_job_state(command_client(ctx).jobs.retry(job_id), json_out)


@app.command()
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
        _print_json(job)
        return
    shown = " ".join(f"{k}={v}" for k, v in job.labels.items()) or "(no labels)"
    out.print(Text(f"job {job.id}: {shown}" + (f"\nnote: {job.note}" if job.note else "")))


def _print_job_state(job: Any, json_out: bool) -> None:
    if json_out:
        _print_json(job)
    else:
        out.print(Text(f"job {job.id}: {job.state}"))


@app.command()
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


@app.command()
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
    """Print a job's log lines, one `[rank N]` prefix each.

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


@app.command()
def checkpoints(ctx: typer.Context, job_id: JobId, json_out: JsonOpt = False) -> None:
    """List a job's complete checkpoints with their ids and export state.

    Example: `torchyard checkpoints 42 --json`
    """
    items = command_client(ctx).jobs.checkpoints(job_id)
    if json_out:
        _print_json(items)
    else:
        out.print(checkpoints_table(items) if items else "no checkpoints")


@app.command()
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
        _print_json(series)
    else:
        out.print(metrics_table(series) if series else "no metrics")


@datasets_app.command("list")
def datasets_list(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """List the project's datasets.

    Example: `torchyard datasets list --json`
    """
    items = command_client(ctx).datasets.list()
    if json_out:
        _print_json(items)
    else:
        out.print(datasets_table(items) if items else "no datasets")


FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        help=f"One of {', '.join(DATASET_FORMATS)}; detected from the file type and first "
        "record when absent.",
    ),
]
TokenDtypeOpt = Annotated[
    str | None,
    typer.Option("--token-dtype", help="uint16 (default) or uint32: token ids of a .bin file."),
]


@datasets_app.command("register")
def datasets_register(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Dataset name.")],
    uri: Annotated[str, typer.Argument(help="A path the server can read (allowed roots).")],
    format: FormatOpt = None,
    token_dtype: TokenDtypeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Register a server-side file or directory as a dataset (a file's records are checked).

    Example: `torchyard datasets register stdlib /usr/lib/python3.11`
    """
    datasets = command_client(ctx).datasets
    _print_dataset(datasets.register(name, uri, format=format, token_dtype=token_dtype), json_out)


@datasets_app.command("upload")
def datasets_upload(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Dataset name.")],
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Local file.")],
    format: FormatOpt = None,
    token_dtype: TokenDtypeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Upload a local file (JSONL, .jsonl.gz/.zst, Parquet, .npy/.bin, text) as a dataset;
    the server checks every record and refuses the file with each bad line listed.

    Example: `torchyard datasets upload chat ./chat.jsonl --format messages`
    """
    datasets = command_client(ctx).datasets
    _print_dataset(datasets.upload(name, path, format=format, token_dtype=token_dtype), json_out)


@datasets_app.command("show")
def datasets_show(
    ctx: typer.Context,
    dataset_id: Annotated[str, typer.Argument(help="Dataset id (ds_...).", metavar="ID")],
    json_out: JsonOpt = False,
) -> None:
    """Show one dataset with its stats (records, lengths, roles, duplicates, warnings).

    Example: `torchyard datasets show ds_0123abcd`
    """
    _print_dataset(command_client(ctx).datasets.get(dataset_id), json_out)


@datasets_app.command("preview")
def datasets_preview(
    ctx: typer.Context,
    dataset_id: Annotated[str, typer.Argument(help="Dataset id (ds_...).", metavar="ID")],
    template: Annotated[
        str | None,
        typer.Option("--template", help="chatml, or a Jinja template (default: the model's)."),
    ] = None,
    model_path: Annotated[
        str | None,
        typer.Option("--model-path", help="Server-side HF model dir (default: byte-level GPT)."),
    ] = None,
    loss_on: Annotated[
        str | None, typer.Option("--loss-on", help="assistant, completion or all.")
    ] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="Context in tokens.")] = None,
    truncation: Annotated[
        str | None, typer.Option("--truncation", help="drop, truncate_left or truncate_right.")
    ] = None,
    num_examples: Annotated[
        int, typer.Option("-n", "--num-examples", help="Records to preview (1-64).")
    ] = 4,
    json_out: JsonOpt = False,
) -> None:
    """Show what a job would learn from the first records: supervised tokens highlighted in
    green, the share per role, and the mask verifier's verdict (exit 1 when it refuses).

    Example: `torchyard datasets preview ds_0123abcd --num-examples 4`
    """
    shown = command_client(ctx).datasets.preview(
        dataset_id,
        model_path=model_path,
        chat_template=template,
        loss_on=loss_on,
        seq_len=seq_len,
        truncation=truncation,
        num_examples=num_examples,
    )
    if json_out:
        _print_json(shown)
    else:
        for example in shown.examples:
            out.print(preview_tokens(example), "\n")
        out.print(preview_report(shown))
        out.print(preview_verdict(shown))
    if shown.refused is not None:
        raise typer.Exit(1)


def _print_dataset(dataset: Dataset, json_out: bool) -> None:
    if json_out:
        _print_json(dataset)
        return
    out.print(datasets_table([dataset]))
    if dataset.stats is not None:
        out.print(dataset_stats_table(dataset.stats))


@app.command()
def login(
    url: Annotated[str, typer.Option("--url", prompt="API URL", help="API base URL.")],
    api_key: Annotated[
        str, typer.Option("--api-key", prompt="API key", hide_input=True, help="API key.")
    ],
    verify: Annotated[bool, typer.Option(help="Check the key against the API first.")] = True,
) -> None:
    """Save the API URL and key to the config file (used when no flag or env var is set).

    Example: `torchyard login --url http://127.0.0.1:8000 --api-key ty_...`
    """
    if verify:
        with Client(url, api_key) as client:
            me = client.me()
        out.print(Text(f"key {me.key.prefix or me.key.id} of project {me.project.name}"))
    path = save_config(url.rstrip("/"), api_key)
    out.print(Text(f"saved to {path}"))


@app.command()
def whoami(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Show the URL, project and key in use.

    Example: `torchyard whoami`
    """
    client = command_client(ctx)
    me = client.me()
    if json_out:
        _print_json({"url": client.base_url, **me.model_dump(mode="json")})
    else:
        out.print(
            Text(
                f"{client.base_url}: project {me.project.name} ({me.project.id}), "
                f"key {me.key.prefix or me.key.id}"
            )
        )


@app.command()
def api(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
) -> None:
    """Run the HTTP API (uvicorn, api.main:create_app).

    Example: `torchyard api --host 0.0.0.0 --port 8000`
    """
    launch.exec_argv(launch.api_argv(host, port))


@app.command()
def worker(
    pool: Annotated[str, typer.Option(help="Queue (resources.pool) to take jobs from.")] = (
        "default"
    ),
    hostname: Annotated[str | None, typer.Option(help="Celery node name.")] = None,
) -> None:
    """Run the host's worker (Celery, threads pool): as many jobs at once as fit its devices.

    Example: `torchyard worker --pool a100`
    """
    launch.exec_argv(launch.worker_argv(pool, hostname))


@app.command()
def exporter(
    queue: Annotated[
        str, typer.Option(help="The export queue (the API's TORCHYARD_EXPORT_QUEUE).")
    ] = os.environ.get("TORCHYARD_EXPORT_QUEUE", "exports"),
    concurrency: Annotated[int, typer.Option(help="Exports at once.", min=1)] = 2,
    hostname: Annotated[str | None, typer.Option(help="Celery node name.")] = None,
) -> None:
    """Run a checkpoint exporter (no GPU needed): it makes the safetensors exports that
    `torchyard export` asks for.

    Example: `torchyard exporter --concurrency 4`
    """
    launch.exec_argv(launch.exporter_argv(queue, concurrency, hostname))


@app.command()
def beat() -> None:
    """Run the periodic scheduler (reaper, reconciler).

    Example: `torchyard beat`
    """
    launch.exec_argv(launch.beat_argv())


@admin_app.command("migrate")
def admin_migrate() -> None:
    """Apply database migrations (TORCHYARD_DATABASE_URL).

    Example: `torchyard admin migrate` (with TORCHYARD_DATABASE_URL set)
    """
    launch.exec_argv(launch.admin_argv("migrate"))


@admin_app.command("bootstrap")
def admin_bootstrap(
    project: Annotated[str, typer.Option("--project", help="Project to create.")],
) -> None:
    """Create a project and an API key; the last line is TORCHYARD_API_KEY=...

    Example: `torchyard admin bootstrap --project vision`
    """
    launch.exec_argv(launch.admin_argv("bootstrap", "--project", project))


def main() -> None:
    """Console-script entry point."""
    app()
