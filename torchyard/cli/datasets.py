"""`torchyard datasets list|register|upload|show|files|sample|preview`: the project's training
data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dataformat.units import format_bytes
from torchyard.cli.common import JsonOpt, command_client, out, print_json
from torchyard.render import (
    dataset_files_table,
    dataset_stats_table,
    datasets_table,
    preview_report,
    preview_tokens,
    preview_verdict,
    sample_records,
)
from torchyard.types import DATASET_FORMATS, Dataset, DatasetFile, LeftOut, NotTextFile

datasets_app = typer.Typer(no_args_is_help=True, help="Training text of the project.")


@datasets_app.command("list")
def datasets_list(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """List the project's datasets.

    Example: `torchyard datasets list --json`
    """
    items = command_client(ctx).datasets.list()
    if json_out:
        print_json(items)
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
    include: Annotated[
        list[str] | None,
        typer.Option(help="A directory's files: glob relative to it (repeatable; default **/*)."),
    ] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option(help="fnmatch pattern of a directory's files to leave out (repeatable)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Register a server-side file or directory as a dataset (a file's records are checked;
    a directory's files that are not UTF-8 text are left out and listed).

    Example: `torchyard datasets register stdlib /usr/lib/python3.11 --include '**/*.py'`
    """
    datasets = command_client(ctx).datasets
    dataset = datasets.register(
        name, uri, format=format, token_dtype=token_dtype, include=include, exclude=exclude
    )
    _print_dataset(dataset, json_out)


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


DatasetArg = Annotated[str, typer.Argument(help="Dataset id (ds_...) or name.", metavar="DATASET")]


@datasets_app.command("show")
def datasets_show(ctx: typer.Context, dataset_id: DatasetArg, json_out: JsonOpt = False) -> None:
    """Show one dataset with its stats (records, lengths, roles, duplicates, warnings).

    Example: `torchyard datasets show ds_0123abcd`
    """
    _print_dataset(command_client(ctx).datasets.get(dataset_id), json_out)


@datasets_app.command("files")
def datasets_files(
    ctx: typer.Context,
    dataset_id: DatasetArg,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 100,
    json_out: JsonOpt = False,
) -> None:
    """List a dataset's files with their sizes, in path order.

    Example: `torchyard datasets files stdlib --limit 20`
    """
    datasets = command_client(ctx).datasets
    found: list[DatasetFile] = []
    cursor: str | None = None
    while True:
        page = datasets.files(dataset_id, limit=min(limit - len(found), 1000), cursor=cursor)
        found += page.items
        cursor = None if page.next_cursor is None else str(page.next_cursor)
        if cursor is None or len(found) >= limit:
            break
    if json_out:
        print_json(found)
        return
    out.print(dataset_files_table(found))
    if cursor is not None:
        out.print(f"(the first {len(found)} files; --limit N shows more)")


@datasets_app.command("sample")
def datasets_sample(
    ctx: typer.Context,
    dataset_id: DatasetArg,
    num_records: Annotated[
        int, typer.Option("-n", "--num-records", min=1, max=20, help="Records to show (1-20).")
    ] = 3,
    json_out: JsonOpt = False,
) -> None:
    """Show a dataset's first records as a job reads them (long values cut).

    Example: `torchyard datasets sample chat -n 2`
    """
    sample = command_client(ctx).datasets.sample(dataset_id, limit=num_records)
    if json_out:
        print_json(sample)
        return
    for record in sample_records(sample):
        out.print(record, "\n")


@datasets_app.command("preview")
def datasets_preview(
    ctx: typer.Context,
    dataset_id: DatasetArg,
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
        print_json(shown)
    else:
        for example in shown.examples:
            out.print(preview_tokens(example), "\n")
        out.print(preview_report(shown))
        out.print(preview_verdict(shown))
    if shown.refused is not None:
        raise typer.Exit(1)


def _print_dataset(dataset: Dataset, json_out: bool) -> None:
    if json_out:
        print_json(dataset)
        return
    out.print(datasets_table([dataset]))
    if dataset.include is not None:
        out.print(f"files: include {', '.join(dataset.include)}", markup=False)
        if dataset.exclude:
            out.print(f"       exclude {', '.join(dataset.exclude)}", markup=False)
    left = dataset.left_out
    if left is not None and left.files:
        out.print(left_out_line(left), markup=False)
        _print_files(left.examples[:5], left.files)
    if left is not None and left.repaired_files:
        out.print(f"text with stray bytes a job drops: {left.repaired_files:,} files", markup=False)
        _print_files(left.repaired[:5], left.repaired_files)
    if dataset.stats is not None:
        out.print(dataset_stats_table(dataset.stats))


def left_out_line(left: LeftOut) -> str:
    """`not UTF-8 text, not read: 80 of 2,450 files, 64% of bytes` for a directory dataset."""
    share = left.bytes / left.of_bytes if left.of_bytes else 0.0
    return (
        f"not UTF-8 text, not read: {left.files:,} of {left.of_files:,} files, "
        f"{share:.0%} of bytes ({format_bytes(left.bytes)})"
    )


def _print_files(shown: list[NotTextFile], total: int) -> None:
    """Each file's path whole at the start of its line, then why (wrapped, never the path)."""
    for f in shown:
        why = f.reason.removeprefix(f"{f.path}: ")
        out.print(f"  {f.path}: {why}", markup=False, overflow="fold")
    if total > len(shown):
        out.print(f"  and {total - len(shown):,} more", markup=False)
