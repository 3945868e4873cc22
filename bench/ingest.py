"""Metric ingestion through the worker's path (`workers.ingest.RunIngest.flush`: tail
events.jsonl, parse, keyed upsert via `core.jobs.upserts`, commit) into Postgres.

    python -m bench.ingest [--points 300000] [--rate 50000] [--seconds 10]

Two runs: `burst` (everything already written, flushed as fast as it goes: the ceiling) and
`sustained` (a writer thread appends lines at `--rate` points/s while the worker loop flushes
every `ingest_interval_s` = 0.2 s, as the supervisor does): points/s and the lag from the
trainer's `time` of a line to the commit that stored it. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.orm import Session

from bench import smoke
from bench._common import (
    backend_cpu_s,
    emit,
    note,
    postgres_database,
    project_key,
    stored_spec,
    summary_ms,
)
from core.jobs import service as jobs
from core.platform.db import HOST_IDLE_IN_TRANSACTION_TIMEOUT_MS, make_engine, session_factory
from workers.ingest import RunIngest
from workers.launcher import RunPaths

NAMES = [f"m{i}" for i in range(10)]  # 10 values per line, like loss/lr/grad_norm/...


def _line(step: int, now: float) -> bytes:
    values = {name: 1.0 / (step + i + 1) for i, name in enumerate(NAMES)}
    record = {"type": "metric", "time": now, "attempt": 1, "step": step, "values": values}
    return json.dumps(record).encode() + b"\n"


def _job(engine, project: str) -> int:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        job_id = int(
            conn.scalar(
                text(
                    "INSERT INTO jobs (project_id, name, state, spec, labels, pool, priority,"
                    " attempt, created_at, updated_at, max_steps, latest_metrics) VALUES"
                    " (:p, 'ingest', 'queued', :spec, '{}', 'bench', 0, 0, now(), now(), 1, '{}')"
                    " RETURNING id"
                ),
                {"p": project, "spec": stored_spec("ingest")},
            )
        )
    with Session(engine) as s:
        assert jobs.claim(session=s, job_id=job_id, worker="bench") is not None
        s.commit()
    return job_id


def burst(engine, project: str, run_dir: Path, points: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    job_id = _job(engine, project)
    paths = RunPaths(run_dir=run_dir, checkpoint_dir="ckpt", data="data")
    now = time.time()
    with paths.events.open("wb") as f:
        for step in range(points // len(NAMES)):
            f.write(_line(step, now))
    ingest = RunIngest(paths=paths, job_id=job_id, attempt=1)
    factory = session_factory(engine)
    server_before = backend_cpu_s(engine)
    started, client_started = time.perf_counter(), time.process_time()
    flushes = 0
    while True:
        ingest.flush(factory)
        flushes += 1
        if not ingest.pending():
            break
    elapsed = time.perf_counter() - started
    client_cpu = time.process_time() - client_started
    server_after = backend_cpu_s(engine)
    server_cpu = sum(t - server_before.get(pid, 0.0) for pid, t in server_after.items())
    per_100k = 100_000 / points
    return {
        "points": points,
        "seconds": round(elapsed, 2),
        "flushes": flushes,
        "points_per_s": round(points / elapsed),
        # CPU per 100k points of this process (parse, COPY encoding) and of its Postgres
        # backends (insert, triggers): the cost itself, whatever else shares the cores. Their
        # sum bounds the rate on an otherwise idle host (the two run one after the other).
        "cpu_s_per_100k_points": {
            "worker": round(client_cpu * per_100k, 3),
            "postgres": round(server_cpu * per_100k, 3),
        },
        "points_per_cpu_s": round(points / (client_cpu + server_cpu)) if server_after else None,
    }


def sustained(engine, project: str, run_dir: Path, rate: int, seconds: float) -> dict[str, object]:  # type: ignore[no-untyped-def]
    job_id = _job(engine, project)
    paths = RunPaths(run_dir=run_dir, checkpoint_dir="ckpt", data="data")
    paths.events.touch()
    done = threading.Event()
    written = [0]

    def writer() -> None:
        lines_per_tick = max(1, rate // len(NAMES) // 100)  # 100 appends per second
        step, start = 0, time.monotonic()
        with paths.events.open("ab", buffering=0) as f:
            while time.monotonic() - start < seconds:
                now = time.time()
                f.write(b"".join(_line(step + i, now) for i in range(lines_per_tick)))
                step += lines_per_tick
                written[0] = step * len(NAMES)
                target = start + step * len(NAMES) / rate
                time.sleep(max(0.0, target - time.monotonic()))
        done.set()

    ingest = RunIngest(paths=paths, job_id=job_id, attempt=1)
    factory = session_factory(engine)
    thread = threading.Thread(target=writer, daemon=True)
    lags: list[float] = []
    started = time.perf_counter()
    thread.start()
    while not done.is_set() or ingest.pending():
        tick = time.monotonic()
        before = ingest.events.offset
        ingest.flush(factory)
        committed = time.time()
        if ingest.events.offset > before:
            with paths.events.open("rb") as f:  # the lines just stored: their trainer times
                f.seek(before)
                chunk = f.read(ingest.events.offset - before)
            times = {json.loads(raw)["time"] for raw in chunk.splitlines() if raw}
            lags += [committed - t for t in times]
        time.sleep(max(0.0, 0.2 - (time.monotonic() - tick)))
    elapsed = time.perf_counter() - started
    return {
        "target_points_per_s": rate,
        "points": written[0],
        "points_per_s": round(written[0] / elapsed),
        "lag": summary_ms(lags),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=300_000)
    parser.add_argument("--rate", type=int, default=50_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = smoke.parse(parser, points=3_000, rate=5_000, seconds=0.5)
    with postgres_database() as url, tempfile.TemporaryDirectory() as tmp:
        project, _ = project_key(url)
        # a worker's engine: each transaction bounded idle (core.platform.db.get_host_engine)
        engine = make_engine(
            url, idle_in_transaction_timeout_ms=HOST_IDLE_IN_TRANSACTION_TIMEOUT_MS
        )
        (Path(tmp) / "a").mkdir()
        (Path(tmp) / "b").mkdir()
        note("burst ...")
        ceiling = burst(engine, project, Path(tmp) / "a", args.points)
        note(f"burst: {ceiling}")
        note("sustained ...")
        steady = sustained(engine, project, Path(tmp) / "b", args.rate, args.seconds)
        engine.dispose()
    emit({"bench": "ingest", "burst": ceiling, "sustained": steady,
          "goal_points_per_s": 250_000})  # fmt: skip


if __name__ == "__main__":
    main()
