"""What a node runs, by the kind of job: the one place that tells the built-in trainer
(`jobspec.job.JobSpec`) from the team's own program (`ScriptJobSpec`, docs/CONTRACTS.md
section 5). Both then go the same way through `workers.node`: spawn, supervise, record.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from core.platform.models import Job
from core.platform.settings import Settings
from jobspec.job import ScriptJobSpec
from workers import attempt, devices, launcher, script
from workers.launcher import GangNode, RunPaths


@dataclass(frozen=True, slots=True)
class Launch:
    """This node's torchrun: its argv, environment and working directory (None: the
    worker's); `plain_command`: an entrypoint command the runner does not wrap, whose ranks
    record no exception (`workers.exits.node_failure`)."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path | None
    plain_command: bool


def prepare(
    settings: Settings,
    factory: Callable[[], Session],
    job: Job,
    *,
    node_rank: int | None,
    node_index: int,
    beat: Callable[[], bool],
) -> RunPaths:
    """This node's run dir: the trainer's (`workers.attempt.prepare`) or an entrypoint job's
    (`workers.script.prepare`: code, Python; `beat` while requirements install).
    `node_rank`: the run dir's node part (None for a single node); `node_index`: the node."""
    spec = job.spec
    if isinstance(spec, ScriptJobSpec):
        return script.prepare(
            settings,
            factory,
            job,
            spec,
            node_rank=node_rank,
            node_index=node_index,
            nproc=spec.resources.procs_per_node,
            beat=beat,
        )
    return attempt.prepare(settings, factory, job, spec, node_rank=node_rank)


def command(
    job: Job, paths: RunPaths, port: int, node: GangNode | None, lease: devices.Lease
) -> Launch:
    """This node's torchrun command: the trainer's, or the entrypoint's command over the
    allow-listed environment in the unpacked code. `port`: the local rendezvous port (one
    node); `node`: its place in a gang."""
    spec = job.spec
    nproc, device = spec.resources.procs_per_node, spec.resources.device
    restarts = spec.retries.max_inplace_restarts
    if isinstance(spec, ScriptJobSpec):
        entry, python = spec.entrypoint, paths.python or sys.executable
        argv = launcher.script_argv(
            job_id=job.id,
            attempt=job.attempt,
            nproc_per_node=nproc,
            rdzv_port=port,
            paths=paths,
            command=entry.command,
            python=python,
            gang=node,
            max_restarts=restarts,
        )
        facts = launcher.ScriptJob(
            job_id=job.id,
            job_name=spec.name,
            attempt=job.attempt,
            env=entry.env,
            keep_last_checkpoints=entry.keep_last_checkpoints,
        )
        env = launcher.script_env(
            base=os.environ,
            job=facts,
            paths=paths,
            python=python,
            nproc_per_node=nproc,
            device=device,
            cpu_count=os.cpu_count(),
            devices=lease.devices,
            host_devices=lease.host_devices,
        )
        plain = launcher.RUNNER_MODULE not in argv[argv.index("--no-python") :]
        return Launch(argv, env, paths.code_dir, plain_command=plain)
    argv = launcher.torchrun_argv(
        job_id=job.id,
        attempt=job.attempt,
        nproc_per_node=nproc,
        rdzv_port=port,
        paths=paths,
        gang=node,
        max_restarts=restarts,
    )
    env = launcher.trainer_env(
        base=os.environ,
        attempt=job.attempt,
        nproc_per_node=nproc,
        device=device,
        cpu_count=os.cpu_count(),
        devices=lease.devices,
        host_devices=lease.host_devices,
    )
    return Launch(argv, env, None, plain_command=False)
