"""What the audit log adds to a submission.

    python -m bench.audit [--requests 300]

Two apps on one migrated Postgres database, in this process (httpx's ASGI transport, no
network): the API as built, and the same API without its `AuditLog` middleware. `--requests`
sequential POST /v1/jobs to each, interleaved so drift hits both alike; each job is stored,
evented and dispatched to Redis (no worker takes it). The transport awaits the whole ASGI call,
so the audited latency includes the audit INSERT, which a uvicorn client does not wait for (the
row is written after the answer is sent): an upper bound. Also times `core.access.audit.record`
alone (one INSERT in its own transaction). Prints one JSON document; about 10-30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from api.audit import AuditLog
from api.main import create_app
from bench import smoke
from bench._common import (
    REDIS_URL,
    emit,
    note,
    postgres_database,
    project_key,
    summary_ms,
    tiny_spec,
)
from core.access import audit
from core.platform.db import make_engine
from core.platform.settings import Settings


def _without_audit(app: FastAPI) -> FastAPI:
    # The middleware stack is built on the first request: drop the audit layer before it.
    app.user_middleware = [m for m in app.user_middleware if m.cls is not AuditLog]
    return app


async def _submissions(apps: dict[str, FastAPI], key: str, corpus: Path, n: int) -> dict:
    headers = {"Authorization": f"Bearer {key}"}
    clients = {
        name: httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bench", headers=headers
        )
        for name, app in apps.items()
    }
    latencies: dict[str, list[float]] = {name: [] for name in apps}
    try:
        first = clients["audited"]
        ds = await first.post("/v1/datasets", json={"name": "c", "uri": str(corpus)})
        ds.raise_for_status()
        spec = tiny_spec(ds.json()["id"], pool=f"bench-audit-{secrets.token_hex(3)}")
        for client in clients.values():  # warm up: connection pools, caches
            for _ in range(20):
                (await client.post("/v1/jobs", json=spec)).raise_for_status()
        for _ in range(n):
            for name, client in clients.items():
                started = time.perf_counter()
                answer = await client.post("/v1/jobs", json=spec)
                latencies[name].append(time.perf_counter() - started)
                answer.raise_for_status()
    finally:
        for client in clients.values():
            await client.aclose()
    out: dict[str, Any] = {name: summary_ms(values) for name, values in latencies.items()}
    for stat in ("p50_ms", "mean_ms"):
        out[f"added_{stat}"] = round(out["audited"][stat] - out["unaudited"][stat], 2)
    return out


def _record_alone(database_url: str, project_id: str, n: int) -> dict[str, float]:
    engine = make_engine(database_url)
    event = audit.Event(
        project_id=project_id,
        actor="bench",
        actor_kind=audit.ActorKind.KEY,
        key_id="key_bench",
        method="POST",
        path="/v1/jobs",
        operation="jobs_create",
        target="1",
        status_code=201,
        source="127.0.0.1",
        request_id="bench",
    )
    samples = []
    try:
        for _ in range(n):
            started = time.perf_counter()
            audit.record(engine=engine, event=event)
            samples.append(time.perf_counter() - started)
    finally:
        engine.dispose()
    return summary_ms(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    args = smoke.parse(parser, requests=4)
    with postgres_database() as url, tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        (corpus / "a.txt").write_text("hello world\n" * 2000)
        project_id, key = project_key(url)
        settings = Settings(
            env="test",
            home=Path(tmp) / "home",
            database_url=url,
            broker_url=REDIS_URL,
            data_roots=[str(corpus)],
        )
        apps = {"audited": create_app(settings), "unaudited": _without_audit(create_app(settings))}
        logging.getLogger("torchyard.access").setLevel(logging.WARNING)  # one line per request
        note(f"{args.requests} submissions to each app, interleaved")
        submissions = asyncio.run(_submissions(apps, key, corpus, args.requests))
        note("core.access.audit.record alone")
        record = _record_alone(url, project_id, 1000)
        for app in apps.values():
            app.state.engine.dispose()
    emit(
        {
            "bench": "audit",
            "requests_per_app": args.requests,
            "submit_latency_ms": submissions,
            "audit_record_insert_ms": record,
            "note": "in-process ASGI: audited latency includes the INSERT a uvicorn client "
            "does not wait for (written after the answer)",
        }
    )


if __name__ == "__main__":
    main()
