"""Shared pieces of the benchmarks: a throw-away Postgres database, a uvicorn API, a worker.

Every bench creates its own database on `TORCHYARD_BENCH_POSTGRES` (default: the test server,
postgresql+psycopg://postgres@127.0.0.1:5432/postgres) and drops it at exit; Redis (for the
benches that run a worker) is `TORCHYARD_BENCH_REDIS` (default redis://127.0.0.1:6379/13).
Loopback only. Each bench prints one JSON document on stdout; progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from core.access import auth
from core.platform.db import make_engine, session_scope, upgrade
from jobspec.job import parse_job_spec

REPO_ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get(
    "TORCHYARD_BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("TORCHYARD_BENCH_REDIS", "redis://127.0.0.1:6379/13")


def note(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def emit(document: dict[str, Any]) -> None:
    print(json.dumps(document, indent=2, sort_keys=False))


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A migrated database of its own (URL), dropped afterwards."""
    name = f"torchyard_bench_{secrets.token_hex(4)}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def project_key(database_url: str) -> tuple[str, str]:
    """(project id, API key) of a new project."""
    engine = make_engine(database_url)
    with session_scope(engine) as s:
        project = auth.create_project(session=s, name=f"bench-{secrets.token_hex(3)}")
        key = auth.create_api_key(session=s, project_id=project.id)
        project_id = project.id
    engine.dispose()
    return project_id, key


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(database_url: str, home: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "TORCHYARD_ENV": "test",
        "TORCHYARD_HOME": str(home),
        "TORCHYARD_DATABASE_URL": database_url,
        "TORCHYARD_BROKER_URL": REDIS_URL,
        "TORCHYARD_STORAGE_URL": str(home / "storage"),
        "TORCHYARD_DATA_ROOTS": json.dumps([str(home)]),
        "TORCHYARD_INGEST_INTERVAL_S": "0.2",
        "TORCHYARD_HEARTBEAT_INTERVAL_S": "1.0",
        "PYTHONPATH": str(REPO_ROOT),
        "OMP_NUM_THREADS": "1",
        **extra,
    }


@contextlib.contextmanager
def process(command: list[str], env: dict[str, str], log_path: Path) -> Iterator[Any]:
    """A subprocess (own process group) terminated, then killed, on exit."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass(frozen=True)
class Server:
    url: str
    pid: int  # leads its own process group (uvicorn's workers are in it)


@contextlib.contextmanager
def api_server(env: dict[str, str], log_path: Path, workers: int = 1) -> Iterator[Server]:
    """`uvicorn api.main:create_app` once `/readyz` answers 200."""
    port = free_port()
    command = [
        sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        "--no-access-log", "--workers", str(workers),
    ]  # fmt: skip
    with process(command, env, log_path) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ready(url, proc, log_path), 60, "the API to be ready")
        yield Server(url, proc.pid)


def _cpu_s(pid: int | str) -> tuple[int, float] | None:
    """(process group, CPU seconds user + system so far) of a process, from /proc; None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[2]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgid: int) -> float:
    """CPU seconds used so far by the live processes of process group `pgid` (this host only)."""
    found = (_cpu_s(pid) for pid in os.listdir("/proc") if pid.isdigit())
    return sum(cpu for group, cpu in filter(None, found) if group == pgid)


def backend_cpu_s(engine: Any) -> dict[int, float]:
    """CPU seconds (user + system) used so far by each Postgres backend of the bench database:
    read from /proc, so only for a server on this host (else empty)."""
    with engine.connect() as conn:
        pids = conn.scalars(
            text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        ).all()
    found = {pid: _cpu_s(pid) for pid in pids}
    return {pid: got[1] for pid, got in found.items() if got is not None}


def _ready(url: str, proc: Any, log_path: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"uvicorn exited: {log_path.read_text()[-3000:]}")
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def worker(env: dict[str, str], queue: str, log_path: Path) -> Iterator[Any]:
    """A solo Celery worker on `queue` (ready when it logs `ready.`)."""
    command = [
        sys.executable, "-m", "celery", "-A", "workers.app:app", "worker", "-Q", queue,
        "-n", f"bench-{secrets.token_hex(3)}@bench", "--pool", "solo", "--concurrency", "1",
        "--prefetch-multiplier", "1", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "--loglevel", "INFO",
    ]  # fmt: skip
    with process(command, env, log_path) as proc:
        wait_for(lambda: "ready." in log_path.read_text(errors="replace"), 60, "the worker")
        yield proc


def wait_for(probe: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)
    return value


def summary_ms(samples_s: list[float]) -> dict[str, float]:
    """p50 / p99 / max / mean of `samples_s` (seconds) in milliseconds."""
    ordered = sorted(samples_s)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))] * 1000

    return {
        "n": len(ordered),
        "p50_ms": round(pct(0.50), 2),
        "p99_ms": round(pct(0.99), 2),
        "max_ms": round(ordered[-1] * 1000, 2),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
    }


def stored_spec(name: str = "bench") -> str:
    """A valid stored job spec (JSON) for rows a bench writes straight into `jobs`: what the
    API would have stored, so every read of the row parses as it does in production."""
    spec = parse_job_spec({**tiny_spec("ds_bench", "bench"), "name": name})
    return spec.model_dump_json()


def tiny_spec(dataset_id: str, pool: str, max_steps: int = 60) -> dict[str, Any]:
    """The spec of the overhead/api benches: trains in seconds on two CPU cores."""
    return {
        "name": "bench-tiny",
        "seed": 1,
        "data": {"dataset": dataset_id},
        "model": {"n_layers": 2, "n_heads": 2, "d_model": 64, "seq_len": 64},
        "optim": {"warmup_steps": min(5, max_steps)},  # a warmup past the run is refused
        "train": {"micro_batch_size": 8, "max_steps": max_steps, "log_interval_steps": 1},
        "eval": {"interval_steps": max_steps, "num_batches": 2},
        "checkpoint": {"interval_steps": max_steps},
        "sample": {"max_new_tokens": 8},
        "resources": {"procs_per_node": 1, "pool": pool},
    }
