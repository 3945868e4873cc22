"""The host's process table, read once per tick for every job a worker runs.

Finding one job's process tree means reading every process of the host (a child knows its
parent, not the reverse): `psutil.Process.children` reads all of `/proc` on each call. A worker
with S running jobs did that S times a second for the usage watch and again every
`sys_metrics_interval_s` for the system metrics, while on a busy host the table holds hundreds
of processes. `ProcessTable.snapshot` reads it once (each process's parent and CPU-seconds from
`/proc/<pid>/stat`) and hands the same `Snapshot` to every caller for `max_age_s`; `HOST` is the
table the watchers of all a worker process's jobs share.

A root that the snapshot does not hold (a job launched since) makes the caller read the table
afresh, so a new job's first look finds its tree; a process started since the snapshot is seen
at the next one, at most `max_age_s` later.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil

MAX_AGE_S = 0.5  # shorter than any watcher's interval: each tick sees its own look
_PROC = "/proc"
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Snapshot:
    """One look at the process table: each process's children and its CPU-seconds (user +
    system, its own and its reaped children's), and when it was taken (`time.monotonic()`)."""

    children: dict[int, list[int]]
    cpu_s: dict[int, float]  # every process of the table
    taken_at: float

    def __contains__(self, pid: int) -> bool:
        return pid in self.cpu_s

    def tree(self, root: int) -> list[int]:
        """`root` and its descendants, root first; [] when `root` is not in the table."""
        if root not in self.cpu_s:
            return []
        found, todo = [], [root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += self.children.get(pid, ())
        return found

    def tree_cpu_s(self, root: int) -> float | None:
        """CPU-seconds of the tree under `root`, its reaped descendants included (what their
        parents' `children_*` times hold); None when `root` is not in the table."""
        pids = self.tree(root)
        return sum(self.cpu_s[pid] for pid in pids) if pids else None


class ProcessTable:
    """Snapshots of the host's process table, shared by threads (see the module docstring)."""

    def __init__(self, max_age_s: float = MAX_AGE_S) -> None:
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._last: Snapshot | None = None

    def snapshot(self, root: int | None = None) -> Snapshot:
        """A snapshot at most `max_age_s` old that holds `root`, if it exists (a fresh one
        when the latest lacks it)."""
        asked = time.monotonic()
        with self._lock:
            last = self._last
            if last is None or not self._serves(last, asked, root):
                last = self._last = _read()
            return last

    def _serves(self, last: Snapshot, asked: float, root: int | None) -> bool:
        if last.taken_at >= asked:  # another thread read it since this call began
            return True
        return asked - last.taken_at <= self.max_age_s and (root is None or root in last)


def _read() -> Snapshot:
    """Every process's parent and CPU-seconds, from /proc (Linux), else through psutil."""
    taken_at = time.monotonic()
    parents = _parents_proc() if os.path.isdir(_PROC) else _parents_psutil()
    children: dict[int, list[int]] = {}
    cpu_s: dict[int, float] = {}
    for pid, (ppid, cpu) in parents.items():
        cpu_s[pid] = cpu
        if ppid != pid:
            children.setdefault(ppid, []).append(pid)
    return Snapshot(children, cpu_s, taken_at)


def _parents_proc() -> dict[int, tuple[int, float]]:
    """{pid: (parent pid, CPU-seconds)} of every process, from /proc/<pid>/stat."""
    found = {}
    for name in os.listdir(_PROC):
        if not name.isdigit():
            continue
        try:
            with open(f"{_PROC}/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone since the listing
            continue
        # pid (comm) state ppid ... utime stime cutime cstime: comm may hold spaces and ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        found[int(name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICKS)
    return found


def _parents_psutil() -> dict[int, tuple[int, float]]:
    found = {}
    for proc in psutil.process_iter(["ppid", "cpu_times"]):
        ppid, t = proc.info["ppid"], proc.info["cpu_times"]
        if ppid is not None and t is not None:
            found[proc.pid] = (ppid, t.user + t.system + t.children_user + t.children_system)
    return found


HOST = ProcessTable()
