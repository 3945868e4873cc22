"""What `bench.fleet` watches while its fleet runs: a thread that samples Postgres, PgBouncer
and /proc every `POLL_S`, and the counters read at its start and end.

Every query goes to Postgres directly (not through PgBouncer, whose pools it reports), on one
connection: the bench's own load is one client polling twice a second.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Engine, text

from bench._common import summary_ms

POLL_S = 0.5
# Tables whose UPDATEs are the fleet's heartbeats and state changes: `workers` (each worker's
# beat), `job_nodes` (each running node's beat), `jobs` (beats and transitions).
UPDATED_TABLES = ("workers", "job_nodes", "jobs")


def _stat(pid: int | str) -> tuple[int, float, float] | None:
    """(parent pid, own CPU s, CPU s of reaped children) of a process; None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    own = (int(fields[11]) + int(fields[12])) / tick
    return int(fields[1]), own, (int(fields[13]) + int(fields[14])) / tick


def tree_cpu_s(root: int) -> tuple[float, float]:
    """(CPU seconds of `root`'s process tree so far: live processes and the children they have
    reaped; CPU seconds of `root` alone, its threads included)."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(p))}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1] + stats[pid][2]
            todo += children.get(pid, [])
    return total, stats[root][1] if root in stats else 0.0


def _pgbouncer_pid() -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if b"pgbouncer" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:
                return int(pid)
    return None


class Probe:
    """Samples until `finish()`, which returns the run's figures (a context manager that
    stops the thread if `finish` was never reached)."""

    def __init__(self, engine: Engine, pgbouncer_host: str, pgbouncer_port: int) -> None:
        self.engine = engine
        self.database = engine.url.database
        self.admin = f"host={pgbouncer_host} port={pgbouncer_port} user=postgres dbname=pgbouncer"
        self.stop = threading.Event()
        self.timeline: list[tuple[float, int, int]] = []  # (time, queued, holding a slot)
        self.connections: list[int] = []
        self.pools: list[dict[str, int]] = []
        self.reconciled: list[float] = []
        self.lags: list[float] = []
        self.backend_cpu: dict[int, list[float]] = {}  # pid -> [first, last] CPU s
        self.pgbouncer = _pgbouncer_pid()
        self.started = time.time()
        self.counters = self._counters()
        self.thread = threading.Thread(target=self._run, name="fleet-probe", daemon=True)
        self.thread.start()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def taken_at(self, t: float) -> tuple[float, int]:
        """(the time of the last sample before `t`, the slots then taken or spoken for: jobs
        queued, starting or running)."""
        i = bisect.bisect_right(self.timeline, (t, 1 << 30, 1 << 30)) - 1
        return (
            (self.timeline[i][0], self.timeline[i][1] + self.timeline[i][2]) if i >= 0 else (0, 0)
        )

    def _counters(self) -> dict[str, float]:
        with self.engine.connect() as conn:
            xacts = conn.scalar(
                text(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database"
                    " WHERE datname = current_database()"
                )
            )
            updates: dict[str, int] = dict(
                conn.execute(
                    text(
                        "SELECT relname, n_tup_upd FROM pg_stat_user_tables"
                        " WHERE relname = ANY(:names)"
                    ),
                    {"names": list(UPDATED_TABLES)},
                ).all()
            )
            points = conn.scalar(text("SELECT count(*) FROM metric_points"))
        found = {f"upd_{k}": float(v) for k, v in updates.items()}
        pgbouncer = _stat(self.pgbouncer) if self.pgbouncer else None
        return {
            **found,
            "xacts": float(xacts or 0),
            "points": float(points or 0),
            "pgbouncer_cpu": pgbouncer[1] if pgbouncer else 0.0,
            "time": time.time(),
        }

    def _run(self) -> None:
        last_seen: dict[int, float] = {}
        tick = 0
        while not self.stop.wait(POLL_S):
            try:
                with self.engine.connect() as conn:
                    self._lag(conn, last_seen)
                    if tick % 2 == 0:
                        self._sample(conn)
            except Exception as exc:  # a sample lost is a gap in the figures, not a failure
                print(f"[bench] probe: {type(exc).__name__}: {exc}", flush=True)
            tick += 1

    def _lag(self, conn: Any, last_seen: dict[int, float]) -> None:
        """Each running job's newest point; one newer than last time is `now - its time` late
        (at most POLL_S more than its real lag)."""
        now = time.time()
        rows = conn.execute(
            text(
                "SELECT p.job_id, max(p.time) FROM metric_points p JOIN jobs j ON j.id = p.job_id"
                " WHERE j.state = 'running' GROUP BY p.job_id"
            )
        ).all()
        for job_id, newest in rows:
            if newest is not None and newest > last_seen.get(job_id, 0.0):
                if job_id in last_seen:
                    self.lags.append(max(0.0, now - newest))
                last_seen[job_id] = newest

    def _sample(self, conn: Any) -> None:
        now = time.time()
        states = dict(conn.execute(text("SELECT state, count(*) FROM jobs GROUP BY state")).all())
        holding = sum(int(states.get(s, 0)) for s in ("starting", "running", "restarting"))
        self.timeline.append((now, int(states.get("queued", 0)), holding))
        pids = conn.scalars(
            text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        ).all()
        self.connections.append(len(pids))
        for pid in pids:
            got = _stat(pid)
            if got is not None:
                self.backend_cpu.setdefault(pid, [got[1], got[1]])[1] = got[1]
        latest = conn.scalar(text("SELECT max(reconciled_at) FROM controllers"))
        if latest is not None and (not self.reconciled or latest.timestamp() > self.reconciled[-1]):
            self.reconciled.append(latest.timestamp())
        with psycopg.connect(self.admin, autocommit=True) as admin:
            cur = psycopg.ClientCursor(admin)  # the admin console speaks the simple protocol
            cur.execute("SHOW POOLS")
            names = [d.name for d in cur.description or []]
            for row in cur.fetchall():
                pool = dict(zip(names, row, strict=True))
                if pool["database"] == self.database:
                    keep = ("cl_active", "cl_waiting", "sv_active", "sv_idle", "maxwait_us")
                    self.pools.append({k: int(pool[k]) for k in keep})

    def finish(self) -> dict[str, Any]:
        """Stop sampling; the figures of the run from this probe's start."""
        self.stop.set()
        self.thread.join(30)
        end = self._counters()
        start = self.counters
        seconds = end["time"] - start["time"]

        def rate(key: str) -> float:
            return round((end.get(key, 0.0) - start.get(key, 0.0)) / seconds, 1)

        spacing = [b - a for a, b in zip(self.reconciled, self.reconciled[1:], strict=False)]
        pools = self.pools or [{}]
        backend_cpu = sum(last - first for first, last in self.backend_cpu.values())
        return {
            "seconds": round(seconds, 1),
            "reconcile_spacing": summary_ms(spacing) if spacing else None,
            "updates_per_s": {table: rate(f"upd_{table}") for table in UPDATED_TABLES},
            "postgres": {
                "transactions_per_s": rate("xacts"),
                "connections_max": max(self.connections, default=0),
                "connections_mean": round(sum(self.connections) / max(1, len(self.connections)), 1),
            },
            "pgbouncer": {
                key: max(p.get(key, 0) for p in pools)
                for key in ("cl_active", "cl_waiting", "sv_active", "sv_idle", "maxwait_us")
            },
            "ingest": {
                "points": int(end["points"] - start["points"]),
                "points_per_s": rate("points"),
                "lag": summary_ms(self.lags) if self.lags else None,
                "poll_s": POLL_S,
            },
            "peak": {
                "queued": max((q for _, q, _ in self.timeline), default=0),
                "holding_slots": max((h for _, _, h in self.timeline), default=0),
            },
            "cpu_s": {
                "postgres": backend_cpu,
                "pgbouncer": end["pgbouncer_cpu"] - start["pgbouncer_cpu"],
            },
        }
