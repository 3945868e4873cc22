"""`torchyard api`, `worker`, `exporter`, `slurm-submitter`, `controller` (`beat`) and `admin
migrate|bootstrap`: the server side (each execs the process `torchyard.launch` describes)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from torchyard import launch

servers_cli = typer.Typer()
admin_app = typer.Typer(no_args_is_help=True, help="Database administration (server side).")


@servers_cli.command()
def api(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
) -> None:
    """Run the HTTP API (uvicorn, api.main:create_app).

    Example: `torchyard api --host 0.0.0.0 --port 8000`
    """
    launch.exec_argv(launch.api_argv(host, port))


@servers_cli.command()
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


@servers_cli.command()
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


@servers_cli.command("slurm-submitter")
def slurm_submitter(
    pool: Annotated[str, typer.Option(help="A pool of TORCHYARD_SLURM_POOLS.")],
    hostname: Annotated[str | None, typer.Option(help="Celery node name.")] = None,
) -> None:
    """Run a Slurm pool's submitter on a login node (`sbatch`, `squeue`, `scancel` on its PATH):
    it places the pool's jobs on the Slurm partition and follows them; `srun` starts a node
    agent per node that trains as a worker would (docs/slurm.md). The pool is
    declared in TORCHYARD_SLURM_POOLS, e.g. `{"h100": {"partition": "gpu", "gpus": true}}`.

    Example: `torchyard slurm-submitter --pool h100`
    """
    launch.exec_argv(launch.slurm_argv(pool, hostname))


@servers_cli.command()
def controller() -> None:
    """Run the controller: the reconcile loop that requeues a lost worker's jobs, ends hung
    ones, preempts and re-sends lost messages, whatever the workers are busy with. Run one or
    more: one leads (a Postgres advisory lock), a standby takes over within seconds.

    Example: `torchyard controller`
    """
    launch.exec_argv(launch.controller_argv())


@servers_cli.command()
def beat() -> None:
    """The controller, under its earlier name (`torchyard controller`).

    Example: `torchyard beat`
    """
    launch.exec_argv(launch.controller_argv())


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
