"""Start a node's torchrun and signal its process tree.

The process starts in a new session (its own process group, pgid == pid; in a sandbox,
`workers.isolation.sandbox`, the namespace's init leads the group): cancel and shutdown SIGTERM that
group and torchrun forwards the signal to every rank; a SIGKILL goes to torchrun's group and to each
rank's own group (`kill_tree`: torchrun starts ranks in new sessions when it redirects their
output). A node's single rank started without torchrun (`workers.lone_rank`) leads
the group itself and takes the signals directly.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from workers.isolation import sandbox
from workers.launcher import RunPaths

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _child_setup(join_fds: tuple[int, ...]) -> Callable[[], None]:
    """What the child does between fork and exec: join the cgroups (`0` is itself), then ask
    for SIGTERM when its parent thread dies. System calls only: no lock another thread of the
    worker could hold."""

    def setup() -> None:
        for fd in join_fds:
            os.write(fd, b"0")
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return setup


def spawn(
    argv: list[str],
    env: Mapping[str, str],
    paths: RunPaths,
    cwd: Path | None = None,
    mounts: sandbox.Mounts | None = None,
    join_fds: Sequence[int] = (),
    grace_s: float = 30.0,
    rank_dir: Path | None = None,
) -> subprocess.Popen[bytes] | sandbox.SandboxedProcess:
    """Start `argv` in a new session (own process group) with its output in the run dir, in
    the directory `cwd` (None: the worker's); with `mounts`, inside the sandbox they describe
    (`workers.isolation.sandbox`: the result's `pid` is torchrun's, the leader of its own group);
    `join_fds`: open `cgroup.procs` files the child joins before it execs
    (`workers.isolation.cgroups`), so everything it starts is born in that cgroup; `grace_s`: a
    sandbox's keeper waits this long after the worker's death before it SIGKILLs the job
    (`workers.isolation.keeper`); `rank_dir`: where the output of a process that is itself
    the node's one rank goes (`workers.lone_rank`: `stdout.log`, `stderr.log`),
    instead of the launcher's files (`RunPaths.launcher_log`).

    On Linux torchrun also gets SIGTERM if the worker dies without cleaning up (even SIGKILL),
    and forwards it to the ranks, which checkpoint and stop: no orphaned trainers.
    `PR_SET_PDEATHSIG` follows the *thread* that forked, not the process: the calling thread
    must outlive the trainer (the worker's pool thread does: it supervises the trainer until
    it exits; measured: a child of a thread that exited got SIGTERM at once). Safe from
    several threads at once: 320 spawns from 8 threads beside 3 logging threads, none hung
    (the `preexec_fn` only makes system calls, no lock another thread could hold).
    """
    paths.log_dir.mkdir(parents=True, exist_ok=True)
    if rank_dir is not None:
        rank_dir.mkdir(parents=True, exist_ok=True)
    outputs = (
        (paths.launcher_log("stdout"), paths.launcher_log("stderr"))
        if rank_dir is None
        else (rank_dir / "stdout.log", rank_dir / "stderr.log")
    )
    with open(outputs[0], "ab") as out, open(outputs[1], "ab") as err:
        if mounts is not None:
            # The parent-death SIGTERM goes to the sandbox's keeper, which stops the job as a
            # cancel does (workers.isolation.keeper).
            return sandbox.start(
                mounts,
                argv,
                env=env,
                cwd=cwd,
                stdout=out.fileno(),
                stderr=err.fileno(),
                preexec_fn=_child_setup(tuple(join_fds)),
                grace_s=grace_s,
            )
        return subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=_child_setup(tuple(join_fds)),
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
