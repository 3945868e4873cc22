"""Every rank of a job runs in a sandbox made by bubblewrap (`bwrap`, Debian's `bubblewrap`).

A team's program (and the built-in trainer, which loads user-provided models and tokenizers)
must see its own job and nothing else. The worker wraps the node's whole `torchrun` in one
`bwrap` (`workers.processes.spawn`), with:

- new user, PID, IPC and cgroup namespaces, all capabilities dropped, a session of its own
  (`--new-session`: no terminal to inject into) and `--die-with-parent`;
- `/proc` of the job's own PID namespace (no ancestor's `/proc/*/environ`: the worker's
  database, broker and storage URLs stay out of reach), a fresh `/dev` (plus the leased
  `/dev/nvidia*` and the control devices on CUDA), a private `/tmp` and `/dev/shm`;
- the system (`/usr`, the merged-usr links, an allow-list of `/etc`) and the Pythons the job
  needs (the worker's `sys.path`, the job's venv) read-only; the worker's home, the storage
  root and the venv root hidden behind empty tmpfs where they lie under those;
- writable: the run directory, the checkpoint directory (or its staging directory) and the row
  cache; read-only: the job's own inputs (datasets, `init_from`, a local model directory; an
  entrypoint job's declared `entrypoint.inputs` at `/inputs/<name>`);
- no network at all (`--unshare-net`: loopback only, where torchrun's rendezvous and gloo run)
  for a single-node job that needs none: local storage, no hub model. Other jobs share the
  host's network (docs/security.md, 'Security': what a job can reach).

`--info-fd` tells the worker the host PID of the namespace's init, which leads the sandbox's
session and process group; torchrun is its only child. The worker signals that group as it
signalled torchrun's own before (init ignores what it has no handler for), so pause,
preemption and kills work unchanged (a SIGKILL of init ends the whole namespace); bwrap's exit
status is torchrun's, a death by signal N reported as 128 + N, which `SandboxedProcess` turns
back into -N like `Popen`. Between the worker and bwrap stands a keeper
(`workers.isolation.keeper`): the worker's death reaches it as SIGTERM (the parent-death signal),
and it stops the sandbox as a cancel does (SIGTERM to the group, the ranks write a stop checkpoint;
SIGKILL after the grace), where bwrap alone would die and take the namespace down with SIGKILL.

Source: bubblewrap(1), https://github.com/containers/bubblewrap.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import site
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

BWRAP = "bwrap"
# What of /etc a process needs: users, name resolution, TLS roots, time zone, the loader.
ETC_ALLOWED = (
    "passwd",
    "group",
    "hosts",
    "host.conf",
    "hostname",
    "resolv.conf",
    "nsswitch.conf",
    "gai.conf",
    "protocols",
    "services",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "localtime",
    "timezone",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "mime.types",
    "os-release",
)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys")
NVIDIA_CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# Torchyard's own packages a rank imports (the trainer, `torchyard.train`, what they import).
PACKAGES = ("trainer", "torchyard", "jobspec", "dataformat", "core", "workers")
FIND_CHILD_S = 10.0  # bwrap's init forks the command at once; a bound on a broken host


class SandboxUnavailable(RuntimeError):
    """This host cannot make the sandbox (no `bwrap`, no user namespaces): the message says why."""


@dataclass(frozen=True, slots=True)
class Mounts:
    """What one node's sandbox shows. Paths are host paths, mounted at the same place.

    `read_only`/`writable`: bound in that order, after the system and the Pythons; a path that
    does not exist is skipped. `hidden`: replaced by an empty tmpfs where they lie under a
    read-only mount (the worker's home under the project's source tree, say), before the
    job's own paths are bound back in. `devices`: extra device nodes (`/dev/nvidia0`).
    `network`: share the host's network; False gives the job loopback only. `placed`: (host
    path, path inside) pairs bound read-only elsewhere than where they lie: a job's declared
    inputs at `/inputs/<name>` (`workers.inputs`).
    """

    read_only: tuple[str, ...] = ()
    placed: tuple[tuple[str, str], ...] = ()
    writable: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    network: bool = True
    python: tuple[str, ...] = field(default_factory=lambda: python_paths(()))


def python_paths(extra: Iterable[str]) -> tuple[str, ...]:
    """The directories the worker's Python and the job's interpreters (`extra`: their paths)
    import from: the prefixes, the site-packages, `PYTHONPATH`, the source tree of Torchyard's
    own packages (an editable install), and each interpreter's venv and the base it links to.
    Never `/`."""
    found: list[str] = [sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages()]
    found += os.environ.get("PYTHONPATH", "").split(os.pathsep)  # the ranks get it too
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            found.append(str(Path(spec.origin).parent.parent))
    for python in [sys.executable, *extra]:
        exe = Path(python)
        found += [str(exe.parent.parent), str(exe.resolve().parent.parent)]
    real = (os.path.realpath(p) for p in found if p)
    return tuple(dict.fromkeys(p for p in real if p != "/" and os.path.isdir(p)))


def bwrap_path() -> str | None:
    return shutil.which(BWRAP)


STOP_SIGNALS = "HUP,INT,TERM"  # what `workers.isolation.keeper` shields bwrap from


def argv(mounts: Mounts, command: Sequence[str], *, cwd: Path | None, info_fd: int) -> list[str]:
    """`bwrap` with its options, then `command`; `cwd` (None: `/`) inside the sandbox;
    `info_fd`: an inherited descriptor bwrap writes `{"child-pid": N}` to."""
    exe = bwrap_path() or BWRAP
    out = [
        exe,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-cgroup-try",
        "--new-session",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--info-fd",
        str(info_fd),
    ]
    if not mounts.network:
        out.append("--unshare-net")
    # The private ones first: what is bound below may lie under /tmp (a test's directories).
    out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            out += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            out += ["--ro-bind", path, path]
    for name in ETC_ALLOWED:
        out += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    shown = [p for p in mounts.python if not p.startswith(SYSTEM_DIRS)]
    for path in _outermost(shown):
        out += ["--ro-bind", path, path]
    masked = [p for p in _real(mounts.hidden) if any(_under(p, top) for top in shown)]
    for path in masked:
        out += ["--tmpfs", path]
    for path in shown:  # a job's venv under the venv root, hidden just now, comes back
        if any(_under(path, top) for top in masked):
            out += ["--ro-bind", path, path]
    for dev in mounts.devices:
        out += ["--dev-bind-try", dev, dev]
    for path in _real(mounts.read_only):
        if os.path.exists(path):
            out += ["--ro-bind", path, path]
    for path in _real(mounts.writable):
        if os.path.exists(path):
            out += ["--bind", path, path]
    for source, inside in mounts.placed:  # last: nothing bound after may cover them
        out += ["--ro-bind", os.path.realpath(source), inside]
    if cwd is not None:
        out += ["--chdir", str(cwd)]
    # The keeper starts bwrap with the stop signals ignored
    # (`workers.isolation.keeper._shield_bwrap`); coreutils' env gives the job's own command the
    # default dispositions back.
    return [*out, "--", "env", f"--default-signal={STOP_SIGNALS}", *command]


def shows(mounts: Mounts, path: str) -> bool:
    """Whether the host path `path` (symlinks followed) is visible at the same place inside the
    sandbox `argv` makes of `mounts`: under a bound directory (the job's own, its Pythons not
    hidden, the system's) or an allowed file of `/etc`. `/proc` and `/dev` count as shown (the
    job's own are there); the host's `/tmp` and `/dev/shm` do not (the job's are empty)."""
    real = os.path.realpath(path)
    if any(_under(real, p) for p in (*_real(mounts.read_only), *_real(mounts.writable))):
        return True
    if real.startswith("/etc/"):
        return real.split("/")[2] in ETC_ALLOWED
    if _under(real, "/proc") or (_under(real, "/dev") and not _under(real, "/dev/shm")):
        return True
    shown = [p for p in mounts.python if not p.startswith(SYSTEM_DIRS)]
    masked = [p for p in _real(mounts.hidden) if any(_under(p, top) for top in shown)]
    if any(_under(real, m) for m in masked):  # hidden, unless a job's venv bound back over it
        return any(_under(real, p) for p in shown if any(_under(p, m) for m in masked))
    return any(_under(real, p) for p in (*shown, *SYSTEM_DIRS) if os.path.isdir(p))


def _real(paths: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(os.path.realpath(p) for p in paths if p))


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _outermost(paths: Sequence[str]) -> list[str]:
    """`paths` without those under another of them (one mount covers them)."""
    ordered = sorted(set(paths), key=len)
    kept: list[str] = []
    for path in ordered:
        if not any(_under(path, top) for top in kept):
            kept.append(path)
    return kept


TORCHRUN_MODULE = "torch.distributed.run"
SANDBOXED_TORCHRUN_MODULE = (
    "workers.isolation.torchrun"  # its rendezvous ids survive a PID namespace
)


def torchrun_command(argv: Sequence[str]) -> list[str]:
    """`argv` (`python -m torch.distributed.run ...`) with torchrun run as
    `workers.isolation.torchrun`, whose rendezvous participants stay distinct in PID namespaces."""
    out = list(argv)
    if out[1:3] == ["-m", TORCHRUN_MODULE]:
        out[2] = SANDBOXED_TORCHRUN_MODULE
    return out


def nvidia_devices(leased: Sequence[int] | None) -> tuple[str, ...]:
    """The device nodes a CUDA job may open: its leased GPUs and the driver's control nodes."""
    if leased is None:
        return ()
    return (*(f"/dev/nvidia{i}" for i in leased), *(f"/dev/{n}" for n in NVIDIA_CONTROL))


def probe() -> str | None:
    """None when this host can make the sandbox, else why not (bwrap missing, namespaces
    refused: its own message)."""
    if bwrap_path() is None:
        return f"`{BWRAP}` is not installed (Debian: apt-get install bubblewrap)"
    r, w = os.pipe()
    try:
        command = argv(Mounts(), ["/bin/true"], cwd=None, info_fd=w)
        done = subprocess.run(
            command, pass_fds=(w,), capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{BWRAP}` could not run: {exc}"
    finally:
        os.close(w)
        os.close(r)
    if done.returncode != 0:
        return f"`{BWRAP}` refused to make a sandbox: {done.stderr.strip() or done.returncode}"
    return None


KEEPER_MODULE = "workers.isolation.keeper"


class SandboxedProcess:
    """A sandbox's keeper process (`workers.isolation.keeper`, bwrap's parent) seen as the torchrun
    inside: `pid` is torchrun's host PID, `pgid`
    its process group's (the namespace's init leads the sandbox's session and group: a signal
    to the group reaches torchrun, and init ignores it, having no handler, as a PID namespace's
    init does); `poll`/`wait` are the keeper's, which ends once every process of the job has,
    with bwrap's status, torchrun's (a death by signal N, 128 + N, is -N as `Popen` says)."""

    def __init__(self, bwrap: subprocess.Popen[bytes], pid: int, pgid: int) -> None:
        self.bwrap = bwrap
        self.pid = pid
        self.pgid = pgid
        self.returncode: int | None = None

    def _code(self, code: int | None) -> int | None:
        if code is None:
            return None
        if 128 < code < 128 + 65:
            code = -(code - 128)
        self.returncode = code
        return code

    def poll(self) -> int | None:
        return self._code(self.bwrap.poll())

    def wait(self, timeout: float | None = None) -> int:
        code = self._code(self.bwrap.wait(timeout))
        assert code is not None
        return code


def start(
    mounts: Mounts,
    command: list[str],
    *,
    env: Mapping[str, str],
    cwd: Path | None,
    stdout: int,
    stderr: int,
    preexec_fn: Callable[[], None] | None = None,
    grace_s: float = 30.0,
) -> SandboxedProcess:
    """Start `command` in the sandbox, under its keeper (`workers.isolation.keeper`: a worker's
    death stops the job with SIGTERM, then SIGKILL after `grace_s`), and find torchrun's host PID.

    Raises OSError when the keeper cannot be started. A sandbox that fails to set up exits
    non-zero with bwrap's message on `stderr`; the process is then the keeper itself."""
    r, w = os.pipe()
    keeper = [sys.executable, "-m", KEEPER_MODULE, "--grace", str(grace_s), "--pass-fd", str(w)]
    try:
        proc = subprocess.Popen(
            [*keeper, "--", *argv(mounts, command, cwd=cwd, info_fd=w)],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            pass_fds=(w,),
            preexec_fn=preexec_fn,
        )
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    try:
        init = _read_info(r)
    finally:
        os.close(r)  # only once bwrap wrote all of it: a write to a closed pipe kills bwrap
    if init is None:
        return SandboxedProcess(proc, proc.pid, proc.pid)
    return SandboxedProcess(proc, _only_child(init, proc), init)


def _read_info(fd: int) -> int | None:
    """The `child-pid` of bwrap's `--info-fd` JSON, which it writes in several pieces once the
    namespace's init is forked, then closes; None when it closed without (it failed)."""
    text = b""
    while chunk := os.read(fd, 65536):
        text += chunk
        try:
            return int(json.loads(text)["child-pid"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def _only_child(pid: int, proc: subprocess.Popen[bytes]) -> int:
    """The host PID of `pid`'s first child (the command bwrap's init forks), waited for while
    the sandbox lives; `pid` itself when none appears."""
    deadline = time.monotonic() + FIND_CHILD_S
    path = Path(f"/proc/{pid}/task/{pid}/children")
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            children = path.read_text().split()
        except OSError:
            break
        if children:
            return int(children[0])
        time.sleep(0.002)
    return pid


_MODE: dict[tuple[str, str], bool] = {}
_UNAVAILABLE: dict[tuple[str, str], str] = {}  # why `auto` fell back to none (the probe's word)


def enabled(sandbox: str, env: str) -> bool:
    """Whether this worker sandboxes its jobs' ranks, by the `sandbox` setting on this host
    (probed once per process): `none` -> False; `bwrap` -> True; `auto` -> True where the
    host can. Raises SandboxUnavailable for `bwrap`, or `auto` in production (`env`), on a
    host that cannot, saying why and how to accept the risk."""
    key = (sandbox, env)
    if key not in _MODE:
        _MODE[key] = _decide(sandbox, env)
    return _MODE[key]


def describe(sandbox: str, env: str) -> str:
    """How this worker contains its jobs, for its row in `workers` (`GET /v1/workers`):
    `bwrap`, or `none: <why>`; `refused: <why>` where it must sandbox and cannot."""
    try:
        if enabled(sandbox, env):
            return "bwrap"
    except SandboxUnavailable as exc:
        return f"refused: {exc}"[:500]
    if sandbox == "none":
        return "none: TORCHYARD_SANDBOX=none"
    return f"none: {_UNAVAILABLE.get((sandbox, env), 'unknown')}"[:500]


def _decide(sandbox: str, env: str) -> bool:
    if sandbox == "none":
        log.warning("TORCHYARD_SANDBOX=none: jobs run unsandboxed and see the worker's files")
        return False
    why = probe()
    if why is None:
        return True
    if sandbox == "bwrap" or env == "production":
        raise SandboxUnavailable(
            f"this host cannot sandbox jobs: {why}. Install bubblewrap and allow user "
            "namespaces, or set TORCHYARD_SANDBOX=none to run jobs unsandboxed (each job can "
            "then read the worker's environment and every project's files)"
        )
    log.warning("jobs run unsandboxed on this host: %s", why)
    _UNAVAILABLE[(sandbox, env)] = why
    return False
