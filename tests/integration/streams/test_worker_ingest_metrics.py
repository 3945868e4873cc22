"""The worker's ingest path: re-reading a run's files stores each point once, and the worker's
Prometheus exporter shows ingest rate, lag and heartbeats."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.db import session_factory
from core.platform.tables import MetricPoint
from workers import observability
from workers.ingest import RunIngest
from workers.launcher import RunPaths, free_port


def _claim(engine: Engine, job_id: int) -> None:
    with Session(engine) as s:
        assert jobs.claim(session=s, job_id=job_id, worker="in-process") is not None
        s.commit()


def _write_events(path: Path, steps: range) -> None:
    now = time.time()
    with path.open("ab") as f:
        for step in steps:
            line = {"type": "metric", "time": now, "attempt": 1, "step": step,
                    "values": {"loss": 1.0 / step, "lr": 1e-3}}  # fmt: skip
            f.write(json.dumps(line).encode() + b"\n")


def _stored(engine: Engine, job_id: int) -> int:
    with engine.connect() as conn:
        query = select(func.count()).select_from(MetricPoint).where(MetricPoint.job_id == job_id)
        return int(conn.scalar(query) or 0)


def test_a_restarted_worker_reingesting_the_same_file_stores_each_point_once(
    engine: Engine, job: dict[str, Any], tmp_path: Path
) -> None:
    _claim(engine, job["id"])
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    _write_events(paths.events, range(1, 501))
    factory = session_factory(engine)
    RunIngest(paths=paths, job_id=job["id"], attempt=1).flush(factory)
    assert _stored(engine, job["id"]) == 1000
    # A new worker process starts from offset 0 and reads everything again.
    RunIngest(paths=paths, job_id=job["id"], attempt=1).flush(factory, final=True)
    assert _stored(engine, job["id"]) == 1000


def test_worker_exporter_shows_ingest_rate_lag_and_heartbeats(
    engine: Engine, job: dict[str, Any], tmp_path: Path
) -> None:
    port = free_port()
    assert observability.start_exporter(port) == port
    _claim(engine, job["id"])
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="ckpt", data="data")
    _write_events(paths.events, range(1, 101))
    RunIngest(paths=paths, job_id=job["id"], attempt=1).flush(session_factory(engine))
    observability.heartbeat(ok=True)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("torchyard_worker_ingested_points_total", ())] >= 200
    assert samples[("torchyard_worker_ingest_lag_seconds_count", ())] >= 1
    assert samples[("torchyard_worker_ingest_flush_seconds_count", ())] >= 1
    assert samples[("torchyard_worker_heartbeats_total", (("outcome", "ok"),))] >= 1
    assert samples[("torchyard_worker_last_heartbeat_seconds", ())] > 0
