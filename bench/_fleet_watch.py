"""SSE watchers on the fleet's running jobs: `watchers` streams (`GET /v1/jobs/{id}/stream`,
as the dashboard and `torchyard logs -f` follow a job) spread evenly over `jobs` jobs running
when they connect, each followed to its end (or `deadline_s`).

Delivery latency of a metric point: its arrival at a watcher minus the point's own `time` (the
job's clock when it reported, this host's): the whole path a watcher sees — the job's report,
the worker's ingest (`ingest_interval_s`), the commit, the API's feed poll and the stream.
Points older than the watcher's connection (the backlog a stream sends first) are left out.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
from sqlalchemy import Engine, text

from bench._common import summary_ms


def _running(engine: Engine, n: int) -> list[tuple[int, str]]:
    """The `n` jobs claimed last that are running: (id, project id)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, project_id FROM jobs WHERE state = 'running'"
                " ORDER BY started_at DESC LIMIT :n"
            ),
            {"n": n},
        ).all()
    return [(int(i), str(p)) for i, p in rows]


async def _watch(
    base: str, targets: list[tuple[int, str]], watchers: int, deadline_s: float
) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    ended = 0
    limits = httpx.Limits(max_connections=watchers + 10, max_keepalive_connections=watchers + 10)
    timeout = httpx.Timeout(60, read=deadline_s)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=timeout) as http:

        async def watcher(job_id: int, key: str) -> None:
            nonlocal ended
            headers = {"Authorization": f"Bearer {key}"}
            async with http.stream("GET", f"/v1/jobs/{job_id}/stream", headers=headers) as answer:
                answer.raise_for_status()
                connected = time.time()
                kind = ""
                async for line in answer.aiter_lines():
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: ") and kind == "metric":
                        sent = float(json.loads(line[6:])["time"])
                        if sent >= connected:
                            latencies.append(time.time() - sent)
                    elif line.startswith("data: ") and kind == "end":
                        ended += 1
                        return

        async def guarded(job_id: int, key: str) -> None:
            try:
                await asyncio.wait_for(watcher(job_id, key), deadline_s)
            except Exception as exc:  # counted: a watcher cut off is a figure, not a crash
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

        picks = [targets[i % len(targets)] for i in range(watchers)]
        await asyncio.gather(*(guarded(job_id, key) for job_id, key in picks))
    return {
        "watchers": watchers,
        "jobs": len(targets),
        "followed_to_end": ended,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "delivery": summary_ms(latencies) if latencies else None,
    }


class Watchers:
    """Connects once `jobs` jobs run (or when `wait_s` has passed, to those running then),
    in a thread of its own; `result` holds the figures once `thread` ends."""

    def __init__(
        self, engine: Engine, base: str, keys: dict[str, str], watchers: int, jobs: int,
        wait_s: float, deadline_s: float,
    ) -> None:  # fmt: skip
        self.engine, self.base, self.keys = engine, base, keys
        self.watchers, self.jobs = watchers, jobs
        self.wait_s, self.deadline_s = wait_s, deadline_s
        self.result: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._run, name="fleet-watchers", daemon=True)

    def start(self) -> Watchers:
        self.thread.start()
        return self

    def _run(self) -> None:
        until = time.monotonic() + self.wait_s
        while len(found := _running(self.engine, self.jobs)) < self.jobs:
            if time.monotonic() > until and found:
                break
            time.sleep(0.5)
        targets = [(job_id, self.keys[project]) for job_id, project in found]
        self.result = asyncio.run(_watch(self.base, targets, self.watchers, self.deadline_s))

    def finish(self) -> dict[str, Any] | None:
        self.thread.join(self.deadline_s + 30)
        return self.result
