"""The fleet's faults, injected from outside as a host's death is: workers SIGKILLed (the whole
process tree: the worker and every job it ran) and started again after `restart_after_s`, and
the leading controller SIGKILLed, with what each cost read back from the control plane's own
records (the jobs' events, the `controllers` table).

- Lost-worker requeue: from the kill to each of its jobs' next `queued` event (the reconciler
  finding the restarted worker's newer `started_at`, or its silence past `worker_timeout_s`);
  `restarted_s`: from the kill to the new worker's start as its row records it.
- Takeover: from the leader's kill to the first reconcile round recorded by another controller.
- Ends: every job terminal, and a `failed` one only with class `node_lost` and its restart
  budget (`retries.max_restarts`) spent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from bench._common import note, summary_ms
from bench._fleet_probe import tree_cpu_s


def _descendants(root: int) -> list[int]:
    """`root` and every process below it (from /proc), parents first."""
    parents: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += parents.get(pid, [])
    return found


def kill_tree(root: int) -> int:
    """SIGKILL `root`'s whole process tree at once (stopped first, so none reaps or respawns
    another in between); the number of processes killed."""
    tree = _descendants(root)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    return len(tree)


class CpuBook:
    """CPU seconds of a kind of process (API, controllers, workers) across kills and restarts:
    a killed process counts what it used until its kill, its replacement from its start."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.start = {pid: tree_cpu_s(pid) for group in pids.values() for pid in group}
        self.groups = {kind: list(group) for kind, group in pids.items()}
        self.final: dict[int, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def killed(self, pid: int) -> None:
        with self.lock:
            self.final[pid] = tree_cpu_s(pid)

    def added(self, kind: str, pid: int) -> None:
        with self.lock:
            self.groups[kind].append(pid)
            self.start[pid] = (0.0, 0.0)

    def spent(self, kind: str) -> tuple[float, float]:
        """(with children, own) CPU seconds of `kind` since the book opened."""
        total = own = 0.0
        for pid in self.groups[kind]:
            end = self.final.get(pid) or tree_cpu_s(pid)
            total += end[0] - self.start[pid][0]
            own += end[1] - self.start[pid][1]
        return total, own


@dataclass
class Faults:
    """Kills at their times (seconds after `start()`): `worker_at` (one worker each, the one
    running the most jobs and not yet killed) and `controller_at` (the leader; None: none)."""

    engine: Engine
    workers: list[subprocess.Popen[bytes]]
    names: list[str]
    controllers: list[subprocess.Popen[bytes]]
    restart: Callable[[int], subprocess.Popen[bytes]]
    book: CpuBook
    worker_at: list[float]
    controller_at: float | None
    restart_after_s: float
    kills: list[dict[str, Any]] = field(default_factory=list)
    takeover: dict[str, Any] | None = None
    error: str | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="fleet-faults", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        started = time.monotonic()
        plan = [(t, "worker") for t in self.worker_at]
        plan += [(self.controller_at, "controller")] if self.controller_at is not None else []
        try:
            for at, kind in sorted(plan):
                time.sleep(max(0.0, at - (time.monotonic() - started)))
                self._kill_worker() if kind == "worker" else self._kill_leader()
        except Exception as exc:  # reported in the figures, not raised in a thread
            self.error = f"{type(exc).__name__}: {exc}"
            note(f"faults: {self.error}")

    def _busy(self) -> dict[str, list[int]]:
        """Each worker's jobs starting or running (by name), once one not yet killed runs
        one (30 s at most): its job's processes die with it."""
        done = {k["worker"] for k in self.kills}
        deadline = time.monotonic() + 30
        while True:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT worker, array_agg(id), bool_or(state = 'running') FROM jobs"
                        " WHERE worker IS NOT NULL AND state IN ('starting', 'running')"
                        " GROUP BY worker"
                    )
                ).all()
            busy = {str(name): list(ids) for name, ids, _ in rows}
            running = {str(name) for name, _, any_running in rows if any_running}
            if running - done or time.monotonic() > deadline:
                return busy
            time.sleep(0.2)

    def _kill_worker(self) -> None:
        done = {k["worker"] for k in self.kills}
        busy = self._busy()
        i = max(
            (j for j, n in enumerate(self.names) if n not in done),
            key=lambda j: len(busy.get(self.names[j], [])),
        )
        victim = self.workers[i]
        self.book.killed(victim.pid)
        at = datetime.now(UTC)
        killed = kill_tree(victim.pid)
        victim.wait()
        jobs = sorted(busy.get(self.names[i], []))
        self.kills.append({"worker": self.names[i], "at": at, "jobs": jobs, "processes": killed})
        note(f"faults: SIGKILLed {self.names[i]} ({killed} processes, jobs {jobs})")
        time.sleep(self.restart_after_s)
        self.workers[i] = self.restart(i)
        self.book.added("workers", self.workers[i].pid)

    def _kill_leader(self) -> None:
        with self.engine.connect() as conn:
            pid = conn.scalar(
                text('SELECT pid FROM controllers WHERE "leading" ORDER BY seen_at DESC LIMIT 1')
            )
        victim = next(c for c in self.controllers if c.pid == pid)
        self.book.killed(victim.pid)
        at = datetime.now(UTC)
        kill_tree(victim.pid)
        victim.wait()
        note(f"faults: SIGKILLed the leading controller (pid {pid})")

        def taken_over() -> datetime | None:
            with self.engine.connect() as conn:
                found = conn.scalar(
                    text(
                        "SELECT min(reconciled_at) FROM controllers"
                        ' WHERE pid != :pid AND "leading" AND reconciled_at > :at'
                    ),
                    {"pid": pid, "at": at},
                )
            return found if isinstance(found, datetime) else None

        deadline = time.monotonic() + 120
        while (when := taken_over()) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        self.takeover = {
            "killed_pid": pid,
            "at": at.isoformat(),
            "takeover_s": round((when - at).total_seconds(), 2) if when else None,
        }

    def figures(self, max_restarts: int) -> dict[str, Any]:
        """What the faults cost, from the jobs' events and states (read after every job ended)."""
        requeue: list[float] = []
        failed_instead = 0
        with self.engine.connect() as conn:
            for kill in self.kills:
                started = conn.scalar(
                    text("SELECT started_at FROM workers WHERE name = :n"), {"n": kill["worker"]}
                )
                back = (started - kill["at"]).total_seconds() if started else None
                kill["back_s"] = round(back, 2) if back is not None else None
                for job_id in kill["jobs"]:
                    found = conn.scalar(
                        text(
                            "SELECT min(created_at) FROM job_events WHERE job_id = :j"
                            " AND state_to = 'queued' AND created_at >= :at"
                        ),
                        {"j": job_id, "at": kill["at"]},
                    )
                    if found is None:
                        failed_instead += 1
                    else:
                        requeue.append((found - kill["at"]).total_seconds())
            ends = conn.execute(
                text(
                    "SELECT state, failure->>'class', restarts_used >= :budget, count(*)"
                    " FROM jobs GROUP BY 1, 2, 3"
                ),
                {"budget": max_restarts},
            ).all()
        unexpected = sum(
            n
            for state, cls, spent, n in ends
            if state != "succeeded" and not (state == "failed" and cls == "node_lost" and spent)
        )
        return {
            "workers_killed": [
                {
                    "worker": k["worker"],
                    "jobs": len(k["jobs"]),
                    "processes": k["processes"],
                    "restarted_s": k["back_s"],
                }
                for k in self.kills
            ],
            "restart_after_s": self.restart_after_s,
            "requeue": summary_ms(requeue) if requeue else None,
            "lost_jobs_not_requeued": failed_instead,
            "controller": self.takeover,
            "ends": dict(_ends(ends)),
            "ends_unexpected": unexpected,
            "error": self.error,
        }


def _ends(rows: Sequence[Any]) -> Counter[str]:
    """Jobs by end (`state`, or `state:failure class`)."""
    found: Counter[str] = Counter()
    for state, cls, _, n in rows:
        found[f"{state}:{cls}" if state == "failed" else state] += int(n)
    return found
