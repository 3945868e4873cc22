"""A cgroup of its own for each node of each job: memory and CPU from its lease, the OOM killer
scoped to it, its `oom_kill` counter read for the failure class.

Without it a job's ranks share the worker's cgroup: one job over its memory can get its
neighbour killed, and an OOM kill is told apart only by the worker's own counter. With it the
node's torchrun (or the sandbox around it, `workers.isolation.sandbox`) is born in
`<the worker's cgroup>/torchyard/<job>-<attempt>-<node>-<random>` (the spawned child joins it
between fork and exec: `join_fds`), so every rank and every process they start is in it and
counted there; the kernel's OOM killer, at the group's limit, kills inside the group only.

Limits: memory `TORCHYARD_SLOT_MEMORY_MB` per leased slot (default: the host's memory divided
by its slots), CPU the lease's share of the host's cores (as `OMP_NUM_THREADS` is split,
`workers.launcher.trainer_env`). cgroup v2 (`memory.max`, `cpu.max`, `memory.events`) where the
host has the unified hierarchy and the worker's own cgroup can delegate (its processes are
moved into a `worker` leaf first: v2 allows no processes beside child groups); else v1's
`memory` and `cpu` controllers (`memory.limit_in_bytes`, `cpu.cfs_quota_us`,
`memory.oom_control`). None where neither is writable (no root, a read-only /sys/fs/cgroup):
the job then runs in the worker's cgroup, as before, and the worker logs it once. On a hybrid
host (v1 controllers, the unified hierarchy at `/sys/fs/cgroup/unified`) the node also joins a
group of the same name there, which holds no controller: it names the job's sockets for the
network fence (`workers.isolation.netfence`, nftables' `socket cgroupv2`), as the v2 group does.

Source: the kernel's cgroup-v1/memory.rst, cgroup-v2.rst.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
UNIFIED = ROOT / "unified"  # the v2 hierarchy of a hybrid host (systemd's layout)
BASE = "torchyard"  # under the worker's own cgroup
CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "cpu")


@dataclass
class JobCgroup:
    """One node's cgroup: its directory per controller (v1) or its one directory (v2)."""

    dirs: list[Path]
    version: int
    _fds: list[int] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.dirs[0]

    def join_fds(self) -> tuple[int, ...]:
        """Descriptors of each directory's `cgroup.procs`, open for writing: a child writes
        `0` to each (itself) between fork and exec (`workers.processes.spawn`). Closed by
        `remove`."""
        if not self._fds:
            self._fds = [os.open(d / "cgroup.procs", os.O_WRONLY) for d in self.dirs]
        return tuple(self._fds)

    def oom_kills(self) -> int | None:
        """How often the OOM killer killed a process of this group (None: no counter)."""
        if self.version == 2:
            return _counter(self.path / "memory.events", "oom_kill")
        return _counter(self.path / "memory.oom_control", "oom_kill")

    def processes(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def remove(self) -> None:
        """Close the join descriptors and remove the group (a group with processes left is
        kept and logged: the next worker start removes it once empty, `sweep`)."""
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cgroup %s not removed: %s", d, exc)


def _counter(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        return None
    return None


def own_paths(proc_cgroup: Path = Path("/proc/self/cgroup")) -> dict[str, str]:
    """{controller: path} of this process's cgroups; "" is the v2 unified hierarchy's."""
    found: dict[str, str] = {}
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            found[name] = path
    return found


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def create(name: str, *, memory_bytes: int | None, cpus: float | None) -> JobCgroup | None:
    """A new group `name` with its limits, under the worker's own; None where this host gives
    the worker none to make (the reason is logged)."""
    own = own_paths()
    try:
        if (ROOT / "cgroup.controllers").exists() and "" in own:
            return _create_v2(own[""], name, memory_bytes, cpus)
        if all(c in own for c in V1_CONTROLLERS) and (ROOT / "memory").is_dir():
            return _create_v1(own, name, memory_bytes, cpus)
    except OSError as exc:
        log.warning("no cgroup of its own for %s: %s", name, exc)
        return None
    log.warning("no cgroup of its own for %s: no writable memory controller", name)
    return None


def _create_v1(
    own: dict[str, str], name: str, memory_bytes: int | None, cpus: float | None
) -> JobCgroup:
    dirs = [ROOT / c / own[c].lstrip("/") / BASE / name for c in V1_CONTROLLERS]
    group = JobCgroup(dirs=[], version=1)
    try:
        for d in dirs:
            d.mkdir(parents=True)
            group.dirs.append(d)
        memory, cpu = dirs
        hybrid = _hybrid_base(own)
        if hybrid is not None:
            try:
                (hybrid / name).mkdir(parents=True)
                group.dirs.append(hybrid / name)  # last: `path` stays the memory group
            except OSError as exc:
                log.warning("no unified cgroup for %s (its sockets are not fenced): %s", name, exc)
        if memory_bytes is not None:
            _write(memory / "memory.limit_in_bytes", str(memory_bytes))
        if cpus is not None:
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(max(1000, int(cpus * CPU_PERIOD_US))))
    except OSError:
        group.remove()
        raise
    return group


# The hybrid layout puts every worker of the host in the same unified group (its root, as a
# rule): each worker's jobs go one level further down, in a group named after the worker, so
# its network fence matches its own jobs only (`workers.isolation.netfence`).
_scope = "worker"


def set_scope(name: str) -> None:
    """Name this worker's group of jobs in a hybrid host's unified hierarchy (before any job)."""
    global _scope
    _scope = name


def _hybrid_base(own: dict[str, str]) -> Path | None:
    """Where a hybrid host's unified groups of this worker's jobs go; None on a host without
    a unified hierarchy."""
    if "" not in own or not (UNIFIED / "cgroup.procs").exists():
        return None
    return UNIFIED / own[""].lstrip("/") / BASE / _scope


def _v2_base(own: str) -> Path:
    """The worker's v2 `torchyard` group, made (with delegation) the first time."""
    top = ROOT / own.lstrip("/")
    base = top / BASE
    if not base.is_dir():
        _delegate(top)
        base.mkdir(exist_ok=True)
        _write(base / "cgroup.subtree_control", "+memory +cpu")
    return base


def fence_parent() -> tuple[Path, int] | None:
    """The v2 group every job's node group of this worker lies in, made if missing, and its
    depth in the v2 hierarchy (the root's children are at 1): what nftables' `socket cgroupv2
    level N` matches (`workers.isolation.netfence`). None where job groups have no v2 side. Raises
    OSError when it cannot be made."""
    own = own_paths()
    if "" not in own:
        return None
    if (ROOT / "cgroup.controllers").exists():
        base, mount = _v2_base(own[""]), ROOT
    elif (hybrid := _hybrid_base(own)) is not None:
        hybrid.mkdir(parents=True, exist_ok=True)
        base, mount = hybrid, UNIFIED
    else:
        return None
    return base, len(base.relative_to(mount).parts)


def _create_v2(own: str, name: str, memory_bytes: int | None, cpus: float | None) -> JobCgroup:
    base = _v2_base(own)
    group = JobCgroup(dirs=[base / name], version=2)
    group.path.mkdir()
    try:
        if memory_bytes is not None:
            _write(group.path / "memory.max", str(memory_bytes))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to cap
                _write(group.path / "memory.swap.max", "0")
        if cpus is not None:
            quota = max(1000, int(cpus * CPU_PERIOD_US))
            _write(group.path / "cpu.max", f"{quota} {CPU_PERIOD_US}")
    except OSError:
        group.remove()
        raise
    return group


def _delegate(top: Path) -> None:
    """Let `top` (the worker's v2 cgroup) hold child groups with memory and CPU control: its
    own processes move to a `worker` leaf, then the controllers are enabled below it."""
    leaf = top / "worker"
    leaf.mkdir(exist_ok=True)
    for pid in (top / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError):  # exited meanwhile
            _write(leaf / "cgroup.procs", pid)
    _write(top / "cgroup.subtree_control", "+memory +cpu")


# A group younger than this is never swept: every worker of a host shares the cgroup its jobs'
# groups go under, and a group just made for a node stays empty until the node's first process
# joins it; another worker starting in that instant removed it (seen in CI: "cannot launch: No
# such file or directory: .../cgroup.procs"). A group is made the instant before its process
# joins, so a minute is far more than the window.
SWEEP_MIN_AGE_S = 60.0


def sweep(*, min_age_s: float = SWEEP_MIN_AGE_S) -> int:
    """Remove the empty groups earlier workers of this cgroup left (a worker killed while
    its jobs ran) that are older than `min_age_s` seconds (a directory's mtime is its
    creation); returns how many."""
    removed = 0
    cutoff = time.time() - min_age_s
    own = own_paths()
    tops: Iterable[Path]
    if "" in own and (ROOT / "cgroup.controllers").exists():
        tops = [ROOT / own[""].lstrip("/") / BASE]
    else:
        tops = [ROOT / c / own.get(c, "/").lstrip("/") / BASE for c in V1_CONTROLLERS]
        hybrid = _hybrid_base(own)
        if hybrid is not None and hybrid.parent.is_dir():  # each worker's: never removed,
            # since a live worker's fence names its group (a new one would not match)
            tops = [*tops, *(d for d in hybrid.parent.iterdir() if d.is_dir())]
    for top in tops:
        if not top.is_dir():
            continue
        for d in top.iterdir():
            with contextlib.suppress(OSError):
                if d.is_dir() and d.stat().st_mtime < cutoff:
                    d.rmdir()
                    removed += 1
    return removed


def node_name(job_id: int, attempt: int, node_rank: int) -> str:
    return f"job{job_id}-a{attempt}-n{node_rank}-{secrets.token_hex(3)}"


def lease_limits(
    *,
    leased: int | None,
    host_slots: int | None,
    slot_memory_mb: int | None,
    total_memory: int,
    cpu_count: int,
) -> tuple[int | None, float | None]:
    """(memory in bytes, CPUs) of a lease of `leased` of the host's `host_slots` slots: the
    slots' memory (`slot_memory_mb` each, else their share of `total_memory`), their share of
    `cpu_count` cores. (None, None) without a lease."""
    if not leased or not host_slots:
        return (slot_memory_mb * 2**20 if slot_memory_mb else None), None
    memory = (
        slot_memory_mb * 2**20 * leased if slot_memory_mb else total_memory * leased // host_slots
    )
    return memory, max(1.0, cpu_count * leased / host_slots)
