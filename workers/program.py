"""The program a node runs, by the kind of job: the one place that tells the built-in trainer
(`jobspec.job.JobSpec`) from the team's own program (`ScriptJobSpec`, docs/CONTRACTS.md
section 5), an eval job's (`trainer.evaluate`) and a session job's (`trainer.session`, its calls
relayed by `workers.watchers.session_relay`). All then go the same way through
`workers.node`: spawn, supervise, record.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.storage import is_remote
from core.platform.tables import Job
from jobspec.inputs import mount_path
from jobspec.job import EvalJobSpec, JobSpec, ScriptJobSpec, SessionJobSpec
from workers import attempt, devices, launcher, lone_rank
from workers.entrypoint import script
from workers.entrypoint.script import venv_root
from workers.isolation import sandbox
from workers.launcher import GangNode, RunPaths
from workers.watchers import session_relay

SESSION_MODULE = "trainer.session"


@dataclass(frozen=True, slots=True)
class Launch:
    """This node's torchrun: its argv, environment and working directory (None: the
    worker's); `plain_command`: an entrypoint command the runner does not wrap, whose ranks
    record no exception (`workers.exits.node_failure`); `rank_dir`: set when the node's one
    rank runs without torchrun (`workers.lone_rank`), where its stdout and stderr
    go (torchrun redirects its ranks' output itself)."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path | None
    plain_command: bool
    rank_dir: Path | None = None


def prepare(
    settings: Settings,
    factory: Callable[[], Session],
    job: Job,
    *,
    node_rank: int | None,
    node_index: int,
    beat: Callable[[], bool],
    worker: str = "",
) -> RunPaths:
    """This node's run dir: the trainer's (`workers.attempt.prepare`; a GRPO job's
    `method.grpo.code` unpacked, `workers.entrypoint.script.unpack_grader_code`) or an
    entrypoint job's (`workers.entrypoint.script.prepare`: code, Python, declared inputs; `beat`
    while requirements install or inputs are fetched). `node_rank`: the run dir's node part
    (None for a single node); `node_index`: the node; `worker`: this worker's name (the inputs'
    events)."""
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
            worker=worker,
        )
    if isinstance(spec, EvalJobSpec):  # its GRPO source's code: the source's graders' files
        paths = attempt.prepare_eval(settings, factory, job, spec)
        code = json.loads(paths.inputs.read_text()).get("source_grader_code")
        return script.unpack_grader_code(factory, job, paths, code)
    if isinstance(spec, SessionJobSpec):  # its program reads its calls from the run dir
        paths = attempt.prepare_session(settings, job, spec)
        session_relay.start_file(factory, paths.run_dir, spec.session.model_id)
        return paths
    paths = attempt.prepare(settings, factory, job, spec, node_rank=node_rank)
    return script.unpack_grader_code(factory, job, paths)


def command(
    job: Job,
    paths: RunPaths,
    port: int,
    node: GangNode | None,
    lease: devices.Lease,
    *,
    sandboxed: bool = False,
) -> Launch:
    """This node's torchrun command: the trainer's, or the entrypoint's command over the
    allow-listed environment in the unpacked code; the program alone, without torchrun, when
    it is the node's one rank (`workers.lone_rank`). `port`: the local rendezvous
    port (one node; a lone rank's `MASTER_PORT`); `node`: its place in a gang; `sandboxed`:
    the ranks run in the sandbox, where the declared inputs lie at `/inputs/<name>` (else
    where they lie on the host)."""
    spec = job.spec
    nproc, device = spec.resources.procs_per_node, spec.resources.device
    restarts = spec.retries.max_inplace_restarts
    single = lone_rank.applies(nproc_per_node=nproc, gang=node, max_restarts=restarts)
    if isinstance(spec, ScriptJobSpec):
        entry, python = spec.entrypoint, paths.python or sys.executable
        facts = launcher.ScriptJob(
            job_id=job.id,
            job_name=spec.name,
            attempt=job.attempt,
            env=entry.env,
            keep_last_checkpoints=entry.keep_last_checkpoints,
            params=entry.params,
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
            inputs={
                name: mount_path(name) if sandboxed else host_path
                for name, host_path in paths.placed_inputs
            },
        )
        if single:
            program = launcher.script_command(entry.command, python)
            plain = launcher.RUNNER_MODULE not in program
            return _lone_rank(job, paths, port, Launch(program, env, paths.code_dir, plain))
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
        plain = launcher.RUNNER_MODULE not in argv[argv.index("--no-python") :]
        return Launch(argv, env, paths.code_dir, plain_command=plain)
    env = launcher.trainer_env(
        base=os.environ,
        attempt=job.attempt,
        nproc_per_node=nproc,
        device=device,
        cpu_count=os.cpu_count(),
        devices=lease.devices,
        host_devices=lease.host_devices,
    )
    program = launcher.trainer_program(paths)
    if isinstance(spec, EvalJobSpec):
        program = launcher.eval_program(paths)
    elif isinstance(spec, SessionJobSpec):
        program = session_program(paths)
    if single:
        return _lone_rank(job, paths, port, Launch([sys.executable, *program], env, None, False))
    if isinstance(spec, EvalJobSpec):
        argv = launcher.eval_argv(
            job_id=job.id,
            attempt=job.attempt,
            nproc_per_node=nproc,
            rdzv_port=port,
            paths=paths,
            max_restarts=restarts,
        )
    else:
        argv = launcher.torchrun_argv(
            job_id=job.id,
            attempt=job.attempt,
            nproc_per_node=nproc,
            rdzv_port=port,
            paths=paths,
            gang=node,
            max_restarts=restarts,
            program=program,
        )
    return Launch(argv, env, None, plain_command=False)


def session_program(paths: RunPaths) -> list[str]:
    """A session job's program and its arguments, after the interpreter (`-m trainer.session`;
    its calls come through `RUN_DIR/session/`, `workers.watchers.session_relay`)."""
    return [
        *("-m", SESSION_MODULE, "--spec", str(paths.spec), "--run-dir", str(paths.run_dir)),
        *("--checkpoint-dir", paths.checkpoint_dir),
    ]


def _lone_rank(job: Job, paths: RunPaths, port: int, launch: Launch) -> Launch:
    """`launch`, a node's lone rank's own command, run without torchrun (`workers.lone_rank`):
    with torchrun's environment for it and its output in torchrun's place."""
    return replace(
        launch,
        env=launch.env
        | lone_rank.env(job_id=job.id, attempt=job.attempt, rdzv_port=port, paths=paths),
        rank_dir=lone_rank.rank_dir(paths, job.id, job.attempt),
    )


def sandbox_mounts(
    settings: Settings, job: Job, paths: RunPaths, node: GangNode | None, lease: devices.Lease
) -> sandbox.Mounts:
    """What this node's sandbox shows (`workers.isolation.sandbox`): the job's own run and
    checkpoint (or staging) directories and the row cache writable; its inputs (datasets,
    `init_from`, a local model directory) read-only, an entrypoint job's declared inputs at
    `/inputs/<name>`, a GRPO job's code directory (`method.grpo.code`) read-only where it lies;
    the worker's home, venv root and storage root hidden; the leased GPUs. No network for a
    single node on local storage without a hub model or an input in an object store: its ranks
    reach each other on loopback, and nothing else."""
    spec = job.spec
    inputs = (paths.data, paths.init_from, paths.eval_data, *paths.extra_inputs)
    local = [_local(uri) for uri in inputs]
    hub_model = False
    named = paths.source_model
    if isinstance(spec, JobSpec) and spec.model.kind == "hf" and spec.model.hf:
        named = spec.model.hf.path_or_id
    if named and os.path.isdir(named):
        local.append(named)
    elif named:
        hub_model = True
    writable = [str(paths.run_dir), _local(paths.checkpoint_dir), str(paths.cache_dir or "")]
    hidden = [str(settings.home.resolve()), str(venv_root(settings))]
    if settings.is_local_storage:
        hidden.append(str(settings.storage_path))
    if hub_model:  # the hub's cache, shared by the host's jobs (public files)
        hf_home = os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")
        Path(hf_home).mkdir(parents=True, exist_ok=True)
        writable.append(hf_home)
    device = spec.resources.device
    placed = [(host, mount_path(name)) for name, host in paths.placed_inputs]
    if paths.grader_code:  # over the writable run dir: graders read the job's code, never write
        placed.append((str(paths.code_dir), str(paths.code_dir)))
    return sandbox.Mounts(
        read_only=tuple(p for p in local if p),
        placed=tuple(placed),
        writable=tuple(p for p in writable if p),
        hidden=tuple(hidden),
        devices=sandbox.nvidia_devices(lease.devices) if device == "cuda" else (),
        network=node is not None
        or not settings.is_local_storage
        or hub_model
        or any(uri and is_remote(uri) for uri in inputs),
        python=sandbox.python_paths([paths.python] if paths.python else []),
    )


def unseen_paths(job: Job, mounts: sandbox.Mounts) -> list[str]:
    """Hints for an entrypoint job whose command names a host path its sandbox does not show
    (an absolute path, alone or as `--flag=/path`, that exists on this host): one line each,
    "`/data/llama` is not visible to the job: declare it in `entrypoint.inputs`"."""
    spec = job.spec
    if not isinstance(spec, ScriptJobSpec):
        return []
    found = []
    for arg in spec.entrypoint.command[1:]:
        path = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if path.startswith("/") and os.path.exists(path) and not sandbox.shows(mounts, path):
            found.append(
                f"`{path}` is not visible to the job: declare it in `entrypoint.inputs` "
                "(it is then at /inputs/<name>)"
            )
    return list(dict.fromkeys(found))


def _local(uri: str | None) -> str:
    """The local path of `uri` (a path or `file://`), "" for a remote one or none."""
    if not uri or is_remote(uri):
        return ""
    return uri.removeprefix("file://")
