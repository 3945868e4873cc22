"""Build and start the one `torchrun` command of an attempt (after Determined's launcher).

The argv and the environment are pure functions of their inputs, unit-tested exactly;
`workers.processes` starts and signals the process.

Per-rank output: torchrun's `--log-dir LOG_DIR --redirects 3` writes each local rank's stdout
and stderr to `LOG_DIR/<rdzv_id>_<random>/attempt_<restart>/<local_rank>/{stdout,stderr}.log`
(torch's `DefaultLogsSpecs`): `attempt_0` for the first run of the worker group, `attempt_N`
after its N-th in-place restart (`--max-restarts`, `retries.max_inplace_restarts`; not to be
confused with the job's attempts, which each get a run dir of their own). torchrun's own output
(rank -1) goes to `RUN_DIR/launcher.{stdout,stderr}.log`. The worker tails all of them by byte
offset (`workers.tail`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobspec.inputs import env_name as input_env_name

TRAINER_MODULE = "trainer"
EVAL_MODULE = "trainer.evaluate"
RUNNER_MODULE = "torchyard.train"  # runs an entrypoint job's python target (section 5)
OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "-Q"})  # python's options that take the next arg
# What of the worker's environment an entrypoint job sees (section 5), besides `*_PREFIXES`.
# `PYTHONPATH` keeps the platform's own packages importable when the worker runs from a
# checkout (the runner `torchyard.train`, `trainer.events`, `dataformat.failures`); the spec
# may not set it.
ALLOWED_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TERM",
        "LD_LIBRARY_PATH",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "XDG_CACHE_HOME",
        "HF_HOME",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "PYTHONPATH",
    }
)
ALLOWED_PREFIXES = ("LC_", "NCCL_", "GLOO_", "TORCH_")
CREDENTIAL_WORDS = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH", re.IGNORECASE)
LOG_REDIRECTS = "3"  # stdout and stderr of every local rank into files under --log-dir
LAUNCHER_RANK = -1


@dataclass(frozen=True, slots=True)
class RunPaths:
    """Where one attempt's files live. `run_dir` is local to the worker host."""

    run_dir: Path
    checkpoint_dir: str
    data: str = ""  # the trainer's `--data` (not set for an entrypoint job)
    init_from: str | None = None  # checkpoint URI of `model.init_from`, resolved by the worker
    eval_data: str | None = None  # `data.eval_dataset`, resolved by the worker
    cache_dir: Path | None = None  # the host's row cache (local: rows are memory-mapped)
    python: str | None = None  # an entrypoint job's interpreter (`workers.entrypoint.venvs`)
    # Remote storage: where an entrypoint job's checkpoints, staged in `checkpoint_dir` on this
    # host, are uploaded (`workers.entrypoint.staging`); None: `checkpoint_dir` is the storage.
    checkpoint_remote: str | None = None
    checkpoint_keep_last: int | None = None  # and how many of them the bucket keeps
    # ... of how many nodes: with several, each node stages and uploads its ranks' part of each
    # checkpoint (`workers.entrypoint.staging`; `TORCHYARD_CHECKPOINT_PARTS` in the program's env).
    checkpoint_nodes: int = 1
    # An eval job's other inputs (its datasets, the source's `init_from`, a local model
    # directory), shown read-only in the sandbox; the locations are in `inputs`.
    extra_inputs: tuple[str, ...] = ()
    # An eval job's source model when it is a Hugging Face `path_or_id` (a local directory,
    # shown read-only, or a hub id, for which the sandbox keeps the network and the hub cache).
    source_model: str | None = None
    # An entrypoint job's declared inputs on this host (`workers.inputs.place`): (name, host
    # path), shown read-only at `/inputs/<name>` in the sandbox; and the cache locks that keep
    # them from eviction while the node runs (released when this object goes).
    placed_inputs: tuple[tuple[str, str], ...] = ()
    input_holds: Any = field(default=None, compare=False, repr=False)
    # A GRPO job's `method.grpo.code` is unpacked at `code_dir`: the trainer's `--code-dir`.
    grader_code: bool = False

    @property
    def code_dir(self) -> Path:
        """The unpacked code archive: an entrypoint job's (each rank's cwd), or `grader_code`."""
        return self.run_dir / "code"

    @property
    def spec(self) -> Path:
        return self.run_dir / "spec.json"

    @property
    def inputs(self) -> Path:
        """An eval job's resolved locations (`core.jobs.evaluations.launch_inputs`)."""
        return self.run_dir / "inputs.json"

    @property
    def events(self) -> Path:
        return self.run_dir / "events.jsonl"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    def launcher_log(self, stream: str) -> Path:
        """torchrun's own `stream` ("stdout" | "stderr"), stored as rank -1."""
        return self.run_dir / f"launcher.{stream}.log"

    def rank_logs(self) -> dict[tuple[int, int, str], Path]:
        """{(restart, local_rank, stream): path} of the per-rank files torchrun has created so
        far; `restart` is torchrun's restart count of the worker group (0 before any)."""
        found: dict[tuple[int, int, str], Path] = {}
        for path in self.log_dir.glob("*/attempt_*/*/std*.log"):
            restart = path.parent.parent.name.removeprefix("attempt_")
            rank, stream = path.parent.name, path.name.removesuffix(".log")
            if restart.isdigit() and rank.isdigit() and stream in ("stdout", "stderr"):
                found[(int(restart), int(rank), stream)] = path
        return dict(sorted(found.items()))


def rdzv_id(job_id: int, attempt: int) -> str:
    return f"job{job_id}-a{attempt}"


@dataclass(frozen=True, slots=True)
class GangNode:
    """This node's place in a multi-node attempt and node 0's c10d rendezvous endpoint."""

    nnodes: int
    node_rank: int
    host: str  # node 0's advertised host
    port: int  # node 0's rendezvous port
    local_addr: str  # this worker's advertised host
    join_timeout_s: int = 120


def gang_rdzv_args(gang: GangNode) -> list[str]:
    """torchrun's multi-node arguments. Node 0 hosts the c10d store (`is_host=1`), the others
    only connect to it (several nodes may share one host, as on loopback in the tests). c10d
    numbers the nodes itself (`--node-rank` is informational there); `--local-addr` is what
    rank 0 publishes as MASTER_ADDR. The store's `read_timeout` (c10d's default 60 s) is the
    join timeout too: a node that waits on the store longer than that while the others start
    (imports, a loaded host) would otherwise fail the rendezvous before the join timeout."""
    timeout = gang.join_timeout_s
    return [
        "--nnodes",
        str(gang.nnodes),
        "--node-rank",
        str(gang.node_rank),
        "--rdzv-conf",
        f"is_host={int(gang.node_rank == 0)},join_timeout={timeout},read_timeout={timeout}",
        "--local-addr",
        gang.local_addr,
    ]


def eval_argv(
    *,
    job_id: int,
    attempt: int,
    nproc_per_node: int,
    rdzv_port: int,
    paths: RunPaths,
    python: str = sys.executable,
    max_restarts: int = 0,
) -> list[str]:
    """The command that runs an eval job's program (`trainer.evaluate`) for one attempt."""
    head = _torchrun_head(
        job_id=job_id,
        attempt=attempt,
        nproc_per_node=nproc_per_node,
        rdzv_port=rdzv_port,
        paths=paths,
        python=python,
        gang=None,
        max_restarts=max_restarts,
    )
    return [*head, *eval_program(paths)]


def eval_program(paths: RunPaths) -> list[str]:
    """An eval job's program and its arguments, after the interpreter (`-m trainer.evaluate`);
    `--code-dir`: its GRPO source's code archive, unpacked (the source's graders' files)."""
    files = ["--spec", str(paths.spec), "--run-dir", str(paths.run_dir)]
    return [
        *("-m", EVAL_MODULE, *files, "--inputs", str(paths.inputs)),
        *(["--cache-dir", str(paths.cache_dir)] if paths.cache_dir else []),
        *(["--code-dir", str(paths.code_dir)] if paths.grader_code else []),
    ]


def _torchrun_head(
    *,
    job_id: int,
    attempt: int,
    nproc_per_node: int,
    rdzv_port: int,
    paths: RunPaths,
    python: str,
    gang: GangNode | None,
    max_restarts: int,
) -> list[str]:
    """torchrun and its own arguments, shared by the trainer's and a script's command."""
    endpoint = f"127.0.0.1:{rdzv_port}" if gang is None else f"{gang.host}:{gang.port}"
    nodes = ["--nnodes", "1"] if gang is None else gang_rdzv_args(gang)
    return [
        python,
        "-m",
        "torch.distributed.run",
        *nodes,
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id(job_id, attempt),
        "--max-restarts",
        str(max_restarts),
        "--log-dir",
        str(paths.log_dir),
        "--redirects",
        LOG_REDIRECTS,
    ]


def torchrun_argv(
    *,
    job_id: int,
    attempt: int,
    nproc_per_node: int,
    rdzv_port: int,
    paths: RunPaths,
    python: str = sys.executable,
    gang: GangNode | None = None,
    max_restarts: int = 0,
    program: Sequence[str] | None = None,
) -> list[str]:
    """The exact command that runs the trainer (or `program`) for one attempt on one node.

    `gang`: this node's part of a multi-node attempt (`--nnodes N`, rendezvous at node 0's
    endpoint; `rdzv_port` is then ignored). `max_restarts`: torchrun's in-place restarts of the
    worker group after a rank fails (`retries.max_inplace_restarts`; the ranks resume from the
    latest complete checkpoint); the platform's own restarts (a new attempt through the queue)
    come after them.
    """
    head = _torchrun_head(
        job_id=job_id,
        attempt=attempt,
        nproc_per_node=nproc_per_node,
        rdzv_port=rdzv_port,
        paths=paths,
        python=python,
        gang=gang,
        max_restarts=max_restarts,
    )
    return [*head, *(trainer_program(paths) if program is None else program)]


def trainer_program(paths: RunPaths) -> list[str]:
    """The trainer and its arguments, after the interpreter (`-m trainer --spec ...`)."""
    return [
        "-m",
        TRAINER_MODULE,
        "--spec",
        str(paths.spec),
        "--run-dir",
        str(paths.run_dir),
        "--checkpoint-dir",
        paths.checkpoint_dir,
        "--data",
        paths.data,
        *(["--init-from", paths.init_from] if paths.init_from else []),
        *(["--eval-data", paths.eval_data] if paths.eval_data else []),
        *(["--cache-dir", str(paths.cache_dir)] if paths.cache_dir else []),
        *(["--code-dir", str(paths.code_dir)] if paths.grader_code else []),
    ]


def script_argv(
    *,
    job_id: int,
    attempt: int,
    nproc_per_node: int,
    rdzv_port: int,
    paths: RunPaths,
    command: Sequence[str],
    python: str,
    torchrun_python: str = sys.executable,
    gang: GangNode | None = None,
    max_restarts: int = 0,
) -> list[str]:
    """The exact command that runs an `entrypoint` job's `command` (docs/CONTRACTS.md section
    5): torchrun's arguments as for the trainer, then `--no-python` and `script_command`.
    `python`: the job's interpreter (`workers.entrypoint.venvs`); `torchrun_python` runs torchrun
    itself."""
    head = _torchrun_head(
        job_id=job_id,
        attempt=attempt,
        nproc_per_node=nproc_per_node,
        rdzv_port=rdzv_port,
        paths=paths,
        python=torchrun_python,
        gang=gang,
        max_restarts=max_restarts,
    )
    return [*head, "--no-python", *script_command(command, python)]


def script_command(command: Sequence[str], python: str) -> list[str]:
    """`[python|python3, *interpreter options, target, *args]` as
    `[python, *options, -m, torchyard.train, target, *args]` (`target`: a script or `-m
    module`; the runner runs it); any other command (`bash run.sh`, `python -c ...`) as it is
    (`python`'s `bin/` is first on `PATH`, `script_env`)."""
    if command[0] not in ("python", "python3"):
        return list(command)
    i = 1
    while i < len(command):
        arg = command[i]
        if arg == "-m" and i + 1 < len(command):
            opts, target, rest = command[1:i], command[i : i + 2], command[i + 2 :]
            break
        if arg in ("-c", "-", "--") or arg.startswith("-c"):
            return list(command)
        if not arg.startswith("-"):
            opts, target, rest = command[1:i], command[i : i + 1], command[i + 1 :]
            break
        i += 2 if arg in OPTIONS_WITH_VALUE else 1
    else:
        return list(command)  # `python` alone, or options only: nothing for the runner
    return [python, *opts, "-m", RUNNER_MODULE, *target, *rest]


def trainer_env(
    *,
    base: Mapping[str, str],
    attempt: int,
    nproc_per_node: int,
    device: str,
    cpu_count: int | None,
    devices: Sequence[int] | None = None,
    host_devices: int | None = None,
) -> dict[str, str]:
    """The child environment: `base` without the worker's secrets, plus the trainer's knobs.

    `devices`: the indices this node leased (`workers.devices.Lease`) of the worker's
    `host_devices`. On CUDA they become `CUDA_VISIBLE_DEVICES` (in `CUDA_DEVICE_ORDER=PCI_BUS_ID`,
    NVML's order, so index i is the GPU the allocator counted as i); each job sees only its own.
    On CPU they are a share of the host's cores: the job gets `cpu_count * len(devices) //
    host_devices` cores, split over its ranks as `OMP_NUM_THREADS` (at least 1 each): torchrun
    leaves one process unthrottled and oversubscribes several (docs/ARCHITECTURE.md, 'Torch
    traps'). Without `devices` the job has all `cpu_count` cores. An `OMP_NUM_THREADS` in the
    worker's own environment caps the threads per rank.
    `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` gives every rendezvous a fresh store (pytorch#135712):
    without it, workers restarted in place by `--max-restarts` hung in 3 of 6 trials
    (docs/ARCHITECTURE.md, 'Torch traps').
    """
    # The worker's own TORCHYARD_* variables (database and broker URLs with their passwords)
    # never reach the trainer.
    env = {k: v for k, v in base.items() if not k.startswith("TORCHYARD_")}
    env["TORCHYARD_ATTEMPT"] = str(attempt)
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env |= _device_env(base, nproc_per_node, device, cpu_count, devices, host_devices)
    return env


def _device_env(
    base: Mapping[str, str],
    nproc_per_node: int,
    device: str,
    cpu_count: int | None,
    devices: Sequence[int] | None,
    host_devices: int | None,
) -> dict[str, str]:
    """`OMP_NUM_THREADS` (CPU) or `CUDA_VISIBLE_DEVICES` (CUDA) of the lease (`trainer_env`)."""
    env: dict[str, str] = {}
    if device == "cpu":
        cores = cpu_count or 1
        if devices and host_devices:
            cores = cores * len(devices) // host_devices
        threads = max(1, cores // nproc_per_node)
        cap = base.get("OMP_NUM_THREADS", "")
        if cap.isdigit() and int(cap) > 0:
            threads = min(threads, int(cap))
        env["OMP_NUM_THREADS"] = str(threads)
    elif devices is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in devices)
    return env


def allowed_env(base: Mapping[str, str]) -> dict[str, str]:
    """The part of the worker's environment `base` that user code may see (`ALLOWED_ENV`,
    `ALLOWED_PREFIXES`; a `TORCH_*` name that looks like a credential is left out)."""
    return {
        k: v
        for k, v in base.items()
        if k in ALLOWED_ENV or (k.startswith(ALLOWED_PREFIXES) and not CREDENTIAL_WORDS.search(k))
    }


@dataclass(frozen=True, slots=True)
class ScriptJob:
    """What the platform tells an entrypoint job's ranks (`TORCHYARD_*`, section 5)."""

    job_id: int
    job_name: str
    attempt: int
    env: Mapping[str, str]  # the spec's `entrypoint.env`
    keep_last_checkpoints: int | None = None
    params: Mapping[str, float | int | str | bool] = field(default_factory=dict)


def script_env(
    *,
    base: Mapping[str, str],
    job: ScriptJob,
    paths: RunPaths,
    python: str,
    nproc_per_node: int,
    device: str,
    cpu_count: int | None,
    devices: Sequence[int] | None = None,
    host_devices: int | None = None,
    inputs: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """An entrypoint job's environment (docs/CONTRACTS.md section 5): the allow-list of the
    worker's `base`, with `python`'s `bin/` first on `PATH`; the lease's devices and threads as
    for the trainer (`trainer_env`); the spec's `env`; then the platform's variables, among them
    `TORCHYARD_INPUT_<NAME>` for each of `inputs` (name -> the path the program sees). No
    database, broker or storage URL, credential or API key of the worker's gets through."""
    env = allowed_env(base)
    env |= _device_env(base, nproc_per_node, device, cpu_count, devices, host_devices)
    bin_dir = os.path.dirname(python)
    env["PATH"] = os.pathsep.join(p for p in (bin_dir, base.get("PATH", "")) if p)
    env |= job.env
    env |= {
        "TORCHYARD_JOB_ID": str(job.job_id),
        "TORCHYARD_JOB_NAME": job.job_name,
        "TORCHYARD_ATTEMPT": str(job.attempt),
        "TORCHYARD_RUN_DIR": str(paths.run_dir),
        "TORCHYARD_CHECKPOINT_DIR": paths.checkpoint_dir,
        "PYTHONUNBUFFERED": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "TORCHYARD_PARAMS": json.dumps(dict(job.params)),
    }
    env |= {input_env_name(name): path for name, path in (inputs or {}).items()}
    if job.keep_last_checkpoints is not None:
        env["TORCHYARD_KEEP_LAST_CHECKPOINTS"] = str(job.keep_last_checkpoints)
    if paths.checkpoint_remote is not None and paths.checkpoint_nodes > 1:
        env["TORCHYARD_CHECKPOINT_PARTS"] = "1"  # each node's local rank 0 declares its part
    return env


# Listening ports are drawn below the kernel's ephemeral range, where `bind(0)`'s ports and every
# outgoing connection's local port lie: on a busy host another process's connection could take one
# between the draw and the rendezvous store's bind (torchrun exits 1, no rank ever ran). Below it
# only an explicit bind can; the draw is random so two rarely meet, and a port in use is skipped.
LISTEN_PORTS_FROM = 20_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1", *, tries: int = 64) -> int:
    """A TCP port free right now on `host`, outside the kernel's ephemeral range where it can
    be (the rendezvous store binds it moments later); the kernel's pick after `tries` draws."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768  # Linux's default
    for _ in range(tries if low - LISTEN_PORTS_FROM > 1_000 else 0):
        port = LISTEN_PORTS_FROM + secrets.randbelow(low - LISTEN_PORTS_FROM)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
