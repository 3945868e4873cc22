"""What `bench.fleet` reads back from the control plane once its jobs have ended: queue ->
claim latency (all, by priority, with a slot free), the jobs' running seconds, and the
reconciler's redispatches (from the controllers' logs)."""

from __future__ import annotations

import bisect
import re
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench._common import summary_ms, wait_for

TERMINAL = ("succeeded", "failed", "cancelled")


def wait_workers(engine: Any, n: int, timeout_s: float) -> None:
    def fresh() -> bool:
        with engine.connect() as conn:
            found = conn.scalar(
                text("SELECT count(*) FROM workers WHERE heartbeat_at > now() - interval '10 s'")
            )
        return int(found or 0) >= n

    wait_for(fresh, timeout_s, f"{n} workers' rows", poll_s=0.5)


def wait_done(engine: Any, jobs: int, timeout_s: float) -> None:
    def done() -> bool:
        with engine.connect() as conn:
            ended = conn.scalar(
                text("SELECT count(*) FROM jobs WHERE state = ANY(:t)"), {"t": list(TERMINAL)}
            )
        return int(ended or 0) >= jobs

    wait_for(done, timeout_s, f"{jobs} jobs to end", poll_s=1.0)


def queue_to_claim(
    engine: Any, taken_at: Any, capacity: int, redispatched: set[int]
) -> tuple[dict[str, Any], list[tuple[float, float, int]]]:
    """Submit (`jobs.created_at`) -> first claim (its first `starting` event): for all jobs, by
    priority, and for those that found a slot free: the slots taken or queued for at the probe's
    last sample (`taken_at`), plus the jobs submitted since, below `capacity`. `redispatched`:
    the ids of the jobs the reconciler sent again, counted by priority. Also each job's
    (claim time, wait s, priority), for the plot."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT j.id, j.priority, j.created_at, min(e.created_at) FROM jobs j"
                " JOIN job_events e ON e.job_id = j.id AND e.state_to = 'starting'"
                " GROUP BY j.id, j.priority, j.created_at"
            )
        ).all()
        states = dict(conn.execute(text("SELECT state, count(*) FROM jobs GROUP BY state")).all())
    waits = sorted(
        (c.timestamp(), (claimed - c).total_seconds(), p, i) for i, p, c, claimed in rows
    )
    created = [c for c, _, _, _ in waits]
    free = []
    for i, (at, wait, _, _) in enumerate(waits):
        sampled, taken = taken_at(at)
        if taken + i - bisect.bisect_right(created, sampled) < capacity:  # jobs since, before
            free.append(wait)
    by_priority: dict[str, Any] = {}
    for priority in sorted({p for _, _, p, _ in waits}):
        mine = [w for _, w, p, _ in waits if p == priority]
        sent_again = sum(1 for _, _, p, i in waits if p == priority and i in redispatched)
        by_priority[str(priority)] = {**summary_ms(mine), "redispatched": sent_again}
    claims = [(at + wait, wait, p) for at, wait, p, _ in waits]
    return {
        "all": summary_ms([w for _, w, _, _ in waits]) if waits else None,
        "slot_free": summary_ms(free) if free else None,
        "by_priority": by_priority,
        "redispatched": len(redispatched),
        "states": {str(k): int(v) for k, v in states.items()},
    }, claims


def job_seconds(engine: Any) -> float:
    """Seconds the jobs ran, summed: each from its claim (`started_at`) to its end."""
    with engine.connect() as conn:
        found = conn.scalar(
            text(
                "SELECT sum(extract(epoch FROM finished_at - started_at)) FROM jobs"
                " WHERE started_at IS NOT NULL AND finished_at IS NOT NULL"
            )
        )
    return float(found or 0.0)


def redispatched(root: Path, controllers: int) -> set[int]:
    """The jobs the leader sent again because they stayed queued past the reconciler's
    `redispatch_after_s` (its `reconcile:` log lines): a long queue, or a lost message."""
    found: set[int] = set()
    for i in range(controllers):
        log = (root / f"controller{i}.log").read_text(errors="replace")
        for listed in re.findall(r"redispatched=\[([^\]]*)\]", log):
            found.update(int(x) for x in listed.split(",") if x.strip())
    return found
