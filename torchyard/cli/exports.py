"""The `torchyard` commands of `torchyard.exports` (typer, rich): the SDK part stays there,
importing neither."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from torchyard.cli.common import command_client, err
from torchyard.units import format_bytes


def export_command(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="Job id.", metavar="JOB")],
    checkpoint_id: Annotated[
        int,
        typer.Argument(help="Checkpoint id (`torchyard checkpoints JOB`).", metavar="CHECKPOINT"),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to save model.safetensors.")],
    timeout_s: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for the export.", min=1)
    ] = 600.0,
    poll_s: Annotated[float, typer.Option("--poll", help="Seconds between polls.", min=0.1)] = 1.0,
) -> None:
    """Export a checkpoint to safetensors on the server, wait for it, and download it.

    Example: `torchyard export 42 7 --out model.safetensors`
    """
    exports = command_client(ctx).exports
    export = exports.request(job_id, checkpoint_id)
    place = f", #{export.queue_position} in the export queue" if export.queue_position else ""
    err.print(
        f"export {export.id} of checkpoint {checkpoint_id} (step {export.step}): "
        f"{export.state}{place}",
        markup=False,
    )
    if export.waiting_for:
        err.print(f"warning: {export.waiting_for}", style="yellow", markup=False)
    export = exports.wait(job_id, checkpoint_id, poll_s=poll_s, timeout_s=timeout_s)
    saved = exports.download(job_id, checkpoint_id, out)
    typer.echo(f"{saved} ({export.size_bytes} bytes, sha256 {export.sha256})")


def export_lora_command(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(help="Job id of a LoRA/QLoRA run.", metavar="JOB")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to save it into.")],
    merged: Annotated[
        bool, typer.Option("--merged", help="The base model with the adapter merged in.")
    ] = False,
) -> None:
    """Download the adapter (or the merged model) a LoRA/QLoRA run wrote when it ended.

    The adapter is a PEFT directory (`peft.PeftModel.from_pretrained(base, DIR)`); `--merged`
    a `transformers` model directory.

    Example: `torchyard export-lora 42 --out ./adapter`
    """
    kind: Literal["adapter", "merged"] = "merged" if merged else "adapter"
    exports = command_client(ctx).exports
    found = getattr(exports.lora(job_id), kind)
    if found is None:
        err.print(f"job {job_id} has no LoRA {kind} (not a LoRA run, or not ended)", markup=False)
        raise typer.Exit(1)
    saved = exports.download_lora(job_id, out, kind=kind)
    total = sum(f.size_bytes for f in found.files)
    typer.echo(f"{saved}: {len(found.files)} files, {format_bytes(total)} (step {found.step})")
