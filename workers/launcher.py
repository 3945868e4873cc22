"""Build and start the one `torchrun` command of an attempt (after Determined's launcher).

The argv and the environment are pure functions of their inputs, unit-tested exactly. The
process starts in a new session (its own process group, pgid == pid): cancel and shutdown
SIGTERM that group and torchrun forwards the signal to every rank; a SIGKILL goes to
torchrun's group and to each rank's own group (`kill_tree`: torchrun starts ranks in new
sessions when it redirects their output).

Per-rank output: torchrun's `--log-dir LOG_DIR --redirects 3` writes each local rank's stdout
and stderr to `LOG_DIR/<rdzv_id>_<random>/attempt_<restart>/<local_rank>/{stdout,stderr}.log`
(torch's `DefaultLogsSpecs`): `attempt_0` for the first run of the worker group, `attempt_N`
after its N-th in-place restart (`--max-restarts`, `retries.max_inplace_restarts`; not to be
confused with the job's attempts, which each get a run dir of their own). torchrun's own output
(rank -1) goes to `RUN_DIR/launcher.{stdout,stderr}.log`. The worker tails all of them by byte
offset (`workers.tail`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TRAINER_MODULE = "trainer"
# The worker's own TORCHYARD_* variables (database and broker URLs with their passwords, ...)
# never reach user code; only these are passed through (fault injection for tests).
PASSTHROUGH_VARS = frozenset({"TORCHYARD_FAIL_AT_STEP"})
LOG_REDIRECTS = "3"  # stdout and stderr of every local rank into files under --log-dir
LAUNCHER_RANK = -1


@dataclass(frozen=True, slots=True)
class RunPaths:
    """Where one attempt's files live. `run_dir` is local to the worker host."""

    run_dir: Path
    checkpoint_dir: str
    data: str
    init_from: str | None = None  # checkpoint URI of `model.init_from`, resolved by the worker
    eval_data: str | None = None  # `data.eval_dataset`, resolved by the worker
    cache_dir: Path | None = None  # the host's row cache (local: rows are memory-mapped)

    @property
    def spec(self) -> Path:
        return self.run_dir / "spec.json"

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
    rank 0 publishes as MASTER_ADDR."""
    return [
        "--nnodes",
        str(gang.nnodes),
        "--node-rank",
        str(gang.node_rank),
        "--rdzv-conf",
        f"is_host={int(gang.node_rank == 0)},join_timeout={gang.join_timeout_s}",
        "--local-addr",
        gang.local_addr,
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
) -> list[str]:
    """The exact command that runs the trainer for one attempt on one node.

    `gang`: this node's part of a multi-node attempt (`--nnodes N`, rendezvous at node 0's
    endpoint; `rdzv_port` is then ignored). `max_restarts`: torchrun's in-place restarts of the
    worker group after a rank fails (`retries.max_inplace_restarts`; the ranks resume from the
    latest complete checkpoint); the platform's own restarts (a new attempt through the queue)
    come after them.
    """
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
    ]


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
    leaves one process unthrottled and oversubscribes several (TORCH_NOTES.md). Without
    `devices` the job has all `cpu_count` cores. An `OMP_NUM_THREADS` in the worker's own
    environment caps the threads per rank.
    `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` gives every rendezvous a fresh store (pytorch#135712):
    without it, workers restarted in place by `--max-restarts` hung in 3 of 6 trials
    (TORCH_NOTES.md).
    """
    env = {k: v for k, v in base.items() if not k.startswith("TORCHYARD_") or k in PASSTHROUGH_VARS}
    env["TORCHYARD_ATTEMPT"] = str(attempt)
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on `host` (the rendezvous store binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(argv: list[str], env: Mapping[str, str], paths: RunPaths) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session (own process group) with its output in the run dir.

    On Linux torchrun also gets SIGTERM if the worker dies without cleaning up (even SIGKILL),
    and forwards it to the ranks, which checkpoint and stop: no orphaned trainers.
    `PR_SET_PDEATHSIG` follows the *thread* that forked, not the process: the calling thread
    must outlive the trainer (the worker's pool thread does: it supervises the trainer until
    it exits; measured: a child of a thread that exited got SIGTERM at once). Safe from
    several threads at once: 320 spawns from 8 threads beside 3 logging threads, none hung
    (the `preexec_fn` only calls prctl, no lock another thread could hold).
    """
    paths.log_dir.mkdir(parents=True, exist_ok=True)
    with (
        open(paths.launcher_log("stdout"), "ab") as out,
        open(paths.launcher_log("stderr"), "ab") as err,
    ):
        return subprocess.Popen(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=_die_with_parent if _prctl is not None else None,
        )


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the process group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def rank_groups(pid: int) -> list[int]:
    """The process groups of torchrun's (`pid`'s) children, its ranks.

    With `--redirects` torchrun starts every rank in a new session (torch's
    `SubprocessHandler`), so a signal to torchrun's own group does not reach them; a SIGKILLed
    torchrun would leave them orphaned. Linux `/proc/PID/task/*/children`; [] elsewhere.
    """
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in children.read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def kill_tree(pgid: int) -> bool:
    """SIGKILL torchrun's group (pgid == torchrun's pid) and each rank's own group; False when
    none was left. The ranks are found before torchrun dies (then they are reparented)."""
    ranks = rank_groups(pgid)
    alive = signal_group(pgid, signal.SIGKILL)
    for rank in ranks:
        alive = signal_group(rank, signal.SIGKILL) or alive
    return alive


def group_alive(pgid: int) -> bool:
    return signal_group(pgid, 0)
