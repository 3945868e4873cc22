"""The API under load, over loopback: uvicorn + Postgres + Redis.

    python -m bench.api [--submissions 400] [--concurrency 16] [--api-workers 1]
                        [--api-replicas 1] [--watchers 200] [--seconds 10]

1. `submit`: `--submissions` POST /v1/jobs from `--concurrency` concurrent clients (each job
   is stored, evented and dispatched to Redis; no worker takes them): jobs/s and latency,
   served by `--api-replicas` uvicorn servers on ports of their own (as replicas behind a
   balancer: client i talks to replica i mod N over one keep-alive connection) of
   `--api-workers` processes each (uvicorn's shared socket: a burst of new connections can
   land mostly on one process); CPU milliseconds per job of the API processes,
   of the bench database's Postgres backends and of this client (from /proc: this host only).
2. `sse`: `--watchers` concurrent GET /v1/jobs/{id}/stream of one running job while a
   writer commits a metric line every 0.2 s (as a worker's ingest does) for `--seconds`:
   whether every watcher got every line, the commit-to-delivery latency, and how many DB
   feeds served them (one per job per API process). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.orm import Session

from bench import smoke
from bench._common import (
    api_server,
    backend_cpu_s,
    emit,
    group_cpu_s,
    note,
    postgres_database,
    project_key,
    server_env,
    summary_ms,
    tiny_spec,
)
from core.jobs import service as jobs
from core.jobs import upserts
from core.platform.db import make_engine, session_scope
from core.platform.tables import JobState


async def submit_load(bases: list[str], key: str, spec: dict[str, Any], n: int, conc: int) -> dict:
    """`n` submissions from `conc` clients; client i talks to `bases[i % len(bases)]` (API
    replicas behind a balancer) over its own keep-alive connection."""
    latencies: list[float] = []
    errors = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=1)
    https = [
        httpx.AsyncClient(base_url=bases[i % len(bases)], headers=headers, timeout=60,
                          limits=limits)
        for i in range(conc)
    ]  # fmt: skip

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal errors
        while not queue.empty():
            queue.get_nowait()
            started = time.perf_counter()
            answer = await http.post("/v1/jobs", json=spec)
            latencies.append(time.perf_counter() - started)
            errors += answer.status_code != 201

    started = time.perf_counter()
    await asyncio.gather(*(client(http) for http in https))
    elapsed = time.perf_counter() - started
    for http in https:
        await http.aclose()
    return {"jobs": n, "concurrency": conc, "errors": errors,
            "jobs_per_s": round(n / elapsed, 1), "latency": summary_ms(latencies)}  # fmt: skip


def _writer(engine: Any, job_id: int, seconds: float, sent: dict[int, float]) -> None:
    step = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        step += 1
        with session_scope(engine) as s:
            point = upserts.Metric("loss", step, 1.0 / step, time.time())
            upserts.metrics(session=s, job_id=job_id, attempt=1, points=[point])
        sent[step] = time.time()  # committed
        time.sleep(0.2)
    with session_scope(engine) as s:
        jobs.transition(session=s, job_id=job_id, to=JobState.SUCCEEDED,
                        from_states=[JobState.RUNNING], message="bench done")  # fmt: skip


async def watch_load(base: str, key: str, job_id: int, watchers: int, engine: Any,
                     seconds: float) -> dict:  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    received: list[dict[int, float]] = [{} for _ in range(watchers)]
    connected = 0
    all_connected = asyncio.Event()
    limits = httpx.Limits(max_connections=watchers + 10, max_keepalive_connections=watchers + 10)
    timeout = httpx.Timeout(60, read=120)
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits,
                                 timeout=timeout) as http:  # fmt: skip

        async def watcher(i: int) -> None:
            nonlocal connected
            async with http.stream("GET", f"/v1/jobs/{job_id}/stream") as answer:
                answer.raise_for_status()
                connected += 1
                if connected == watchers:
                    all_connected.set()
                kind = ""
                async for line in answer.aiter_lines():
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: ") and kind == "metric":
                        received[i][json.loads(line[6:])["step"]] = time.time()
                    elif line.startswith("data: ") and kind == "end":
                        return

        tasks = [asyncio.create_task(watcher(i)) for i in range(watchers)]
        await asyncio.wait_for(all_connected.wait(), 60)
        feeds = await http.get("/metrics")
        sent: dict[int, float] = {}
        thread = threading.Thread(target=_writer, args=(engine, job_id, seconds, sent))
        thread.start()
        await asyncio.gather(*tasks)
        thread.join()
    feeds_line = [x for x in feeds.text.splitlines() if x.startswith("torchyard_stream_feeds ")]
    lat = [got[s] - sent[s] for got in received for s in sent if s in got]
    complete = sum(all(s in got for s in sent) for got in received)
    return {
        "watchers": watchers,
        "lines_committed": len(sent),
        "watchers_with_every_line": complete,
        "delivery_latency": summary_ms(lat) if lat else None,
        "db_feeds_for_all_watchers": float(feeds_line[0].split()[1]) if feeds_line else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--submissions", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--api-workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument(
        "--api-replicas", type=int, default=1,
        help="uvicorn servers on ports of their own, the clients spread evenly over them",
    )  # fmt: skip
    parser.add_argument("--watchers", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = smoke.parse(parser, submissions=16, concurrency=4, watchers=4, seconds=1.0)
    with postgres_database() as url, tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        _, key = project_key(url)
        (home / "corpus").mkdir()
        (home / "corpus" / "a.txt").write_text("hello torchyard\n" * 5000)
        env = server_env(url, home)
        engine = make_engine(url)
        with contextlib.ExitStack() as stack:
            servers = [
                stack.enter_context(
                    api_server(env, home / f"uvicorn{i}.log", workers=args.api_workers)
                )
                for i in range(args.api_replicas)
            ]
            headers = {"Authorization": f"Bearer {key}"}
            base = servers[0].url
            ds = httpx.post(f"{base}/v1/datasets", headers=headers, timeout=60,
                            json={"name": "corpus", "uri": str(home / "corpus")})  # fmt: skip
            ds.raise_for_status()
            spec = tiny_spec(ds.json()["id"], pool=f"bench-{secrets.token_hex(3)}")
            note("submissions ...")
            api_cpu = sum(group_cpu_s(server.pid) for server in servers)
            db_cpu = backend_cpu_s(engine)
            client_cpu = time.process_time()
            urls = [server.url for server in servers]
            submit = asyncio.run(submit_load(urls, key, spec, args.submissions, args.concurrency))
            client_cpu = time.process_time() - client_cpu
            api_cpu = sum(group_cpu_s(server.pid) for server in servers) - api_cpu
            db_after = backend_cpu_s(engine)
            db_cpu_s = sum(t - db_cpu.get(pid, 0.0) for pid, t in db_after.items())
            per_job = 1000 / args.submissions
            submit["cpu_ms_per_job"] = {
                "api": round(api_cpu * per_job, 2),
                "postgres": round(db_cpu_s * per_job, 2),
                "client": round(client_cpu * per_job, 2),
            }
            note(f"submit: {submit}")
            job_id = httpx.post(f"{base}/v1/jobs", headers=headers, json=spec).json()["id"]
            with Session(engine) as s:
                jobs.claim(session=s, job_id=job_id, worker="bench")
                jobs.transition(session=s, job_id=job_id, to=JobState.RUNNING,
                                from_states=[JobState.STARTING], message="bench")  # fmt: skip
                s.commit()
            note("watchers ...")
            sse = asyncio.run(watch_load(base, key, job_id, args.watchers, engine, args.seconds))
        engine.dispose()
    emit({"bench": "api", "api_workers": args.api_workers, "api_replicas": args.api_replicas,
          "submit": submit, "sse": sse})  # fmt: skip


if __name__ == "__main__":
    main()
