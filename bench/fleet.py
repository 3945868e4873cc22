"""The control plane at fleet scale, simulated with the real processes (issue 49).

    python -m bench.fleet [--workers 8] [--slots 4] [--jobs 300] [--rate 2.0] [--burst 40]
                          [--projects 4] [--api-procs 2] [--controllers 2] [--steps 20]
                          [--step-s 0.5] [--checkpoint-every 10] [--series 10]

Starts, on this host: an API (`uvicorn`, `--api-procs` processes), `--controllers` controllers
(one leads), `--workers` real workers (`celery ... worker`, as `torchyard worker` runs it), each
with `--slots` CPU slots (`TORCHYARD_WORKER_SLOTS`), a home and a name of its own, so the control
plane sees that many hosts; Postgres behind PgBouncer (transaction pooling, `--pgbouncer`) for
the API and workers, the controllers direct (README's Deployment); Redis. Every job is a real
`entrypoint` job whose program (`FLEET_PY`, `torchyard.train` only) reports `--series` series
every step, sleeps `--step-s` between steps and checkpoints a small file every
`--checkpoint-every` steps, so each part of the control plane does its real work (claim, sandbox,
ingest, checkpoints, heartbeats, reconcile) while the host's CPUs stay mostly free.

Submissions: a Poisson stream of `--rate` jobs/s over `--projects` projects (random priorities
0-2) with, halfway, a burst of `--burst` at once (a sweep starting), `--jobs` in all. Measured
from the stream's start until every job has ended, printed as one JSON document: submit latency
and throughput; queue -> claim latency (all jobs, and those submitted with a slot free and no
job queued); the spacing of the leader's reconcile rounds (2 s, or a round's length when
longer); heartbeat UPDATEs/s (`pg_stat_user_tables`); Postgres transactions/s
(`pg_stat_database`) and connections (`pg_stat_activity`), PgBouncer's pools (`SHOW POOLS`);
metric points/s and ingest lag (a point's `time` to the first poll that sees it: an upper
bound, `poll_s` coarse); CPU seconds per 1,000 jobs of the API, controllers, workers (their own
process, and with their jobs), Postgres' backends of this database and PgBouncer (from /proc:
this host only). Nothing in the product knows it is simulated: the workers are workers, the
jobs are jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import io
import os
import random
import re
import secrets
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench import smoke
from bench._common import (
    REDIS_URL,
    REPO_ROOT,
    api_server,
    emit,
    note,
    postgres_database,
    process,
    project_key,
    summary_ms,
    wait_for,
)
from bench._fleet_probe import Probe, tree_cpu_s
from torchyard.launch import worker_argv

FLEET_PY = """
import argparse
import time

import torchyard.train as ty

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--step-s", type=float, required=True)
parser.add_argument("--checkpoint-every", type=int, required=True)
parser.add_argument("--series", type=int, required=True)
args = parser.parse_args()
ty.set_max_steps(args.steps)
latest = ty.latest_checkpoint()
step = int((latest / "step.txt").read_text()) if latest else 0
while step < args.steps and not ty.should_stop():
    time.sleep(args.step_s)
    step += 1
    ty.report(step, **{f"m{i}": 1.0 / (step + i) for i in range(args.series)})
    if step % args.checkpoint_every == 0 or step == args.steps:
        path = ty.checkpoint_dir(step)
        (path / "step.txt").write_text(str(step))
        (path / "state.bin").write_bytes(bytes(4096))
        ty.completed_checkpoint(path)
"""
TERMINAL = ("succeeded", "failed", "cancelled")


def _tar_gz(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, body in files.items():
            data = body.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _env(home: Path, pooled_url: str, direct_url: str, storage: Path, **extra: str) -> dict:
    """A process of the deployment: production settings (intervals left at their defaults)."""
    return {
        **os.environ,
        "TORCHYARD_ENV": "test",  # loopback Postgres without a password; nothing else differs
        "TORCHYARD_HOME": str(home),
        "TORCHYARD_DATABASE_URL": pooled_url,
        "TORCHYARD_DATABASE_DIRECT_URL": direct_url,
        "TORCHYARD_BROKER_URL": REDIS_URL,
        "TORCHYARD_STORAGE_URL": str(storage),
        "PYTHONPATH": str(REPO_ROOT),
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def _schedule(args: argparse.Namespace, rng: random.Random) -> list[float]:
    """Submission times (s from the start): Poisson at `rate`, a burst of `burst` halfway."""
    stream = args.jobs - args.burst
    times, t = [], 0.0
    for _ in range(stream):
        t += rng.expovariate(args.rate)
        times.append(t)
    halfway = times[len(times) // 2] if times else 0.0
    return sorted(times + [halfway] * args.burst)


async def submit_stream(
    base: str, keys: list[str], body: dict[str, dict], at: list[float], rng: random.Random
) -> dict[str, Any]:
    """Each submission at its time (open loop: a slow answer does not delay the next)."""
    latencies: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as http:
        started = time.perf_counter()

        async def one(when: float) -> None:
            await asyncio.sleep(max(0.0, when - (time.perf_counter() - started)))
            key = rng.choice(keys)
            spec = {**body[key], "priority": rng.randint(0, 2)}
            t0 = time.perf_counter()
            answer = await http.post(
                "/v1/jobs", json=spec, headers={"Authorization": f"Bearer {key}"}
            )
            latencies.append(time.perf_counter() - t0)
            if answer.status_code != 201:
                errors.append(f"{answer.status_code} {answer.text[:200]}")

        await asyncio.gather(*(one(when) for when in at))
        elapsed = time.perf_counter() - started
    return {
        "jobs": len(at),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "offered_per_s": round(len(at) / max(at[-1], 1e-9), 2),
        "jobs_per_s": round(len(at) / elapsed, 2),
        "latency": summary_ms(latencies),
    }


def _upload_code(base: str, key: str) -> str:
    answer = httpx.post(
        f"{base}/v1/code",
        headers={"Authorization": f"Bearer {key}"},
        files={"file": ("fleet.tar.gz", _tar_gz({"fleet.py": FLEET_PY}), "application/gzip")},
        timeout=60,
    )
    answer.raise_for_status()
    return str(answer.json()["id"])


def _spec(code: str, pool: str, args: argparse.Namespace) -> dict[str, Any]:
    command = ["python", "fleet.py", "--steps", str(args.steps), "--step-s", str(args.step_s)]
    command += ["--checkpoint-every", str(args.checkpoint_every), "--series", str(args.series)]
    return {
        "name": "fleet",
        "entrypoint": {"code": code, "command": command},
        "resources": {"procs_per_node": 1, "pool": pool},
    }


def _wait_workers(engine: Any, n: int, timeout_s: float) -> None:
    def fresh() -> bool:
        with engine.connect() as conn:
            found = conn.scalar(
                text("SELECT count(*) FROM workers WHERE heartbeat_at > now() - interval '10 s'")
            )
        return int(found or 0) >= n

    wait_for(fresh, timeout_s, f"{n} workers' rows", poll_s=0.5)


def _wait_done(engine: Any, jobs: int, timeout_s: float) -> None:
    def done() -> bool:
        with engine.connect() as conn:
            ended = conn.scalar(
                text("SELECT count(*) FROM jobs WHERE state = ANY(:t)"), {"t": list(TERMINAL)}
            )
        return int(ended or 0) >= jobs

    wait_for(done, timeout_s, f"{jobs} jobs to end", poll_s=1.0)


def _queue_to_claim(
    engine: Any, taken_at: Any, capacity: int, redispatched: set[int]
) -> dict[str, Any]:
    """Submit (`jobs.created_at`) -> first claim (its first `starting` event): for all jobs, by
    priority, and for those that found a slot free: the slots taken or queued for at the probe's
    last sample (`taken_at`), plus the jobs submitted since, below `capacity`. `redispatched`:
    the ids of the jobs the reconciler sent again, counted by priority."""
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
    return {
        "all": summary_ms([w for _, w, _, _ in waits]) if waits else None,
        "slot_free": summary_ms(free) if free else None,
        "by_priority": by_priority,
        "redispatched": len(redispatched),
        "states": {str(k): int(v) for k, v in states.items()},
    }


def _job_seconds(engine: Any) -> float:
    """Seconds the jobs ran, summed: each from its claim (`started_at`) to its end."""
    with engine.connect() as conn:
        found = conn.scalar(
            text(
                "SELECT sum(extract(epoch FROM finished_at - started_at)) FROM jobs"
                " WHERE started_at IS NOT NULL AND finished_at IS NOT NULL"
            )
        )
    return float(found or 0.0)


def _redispatched(root: Path, controllers: int) -> set[int]:
    """The jobs the leader sent again because they stayed queued past the reconciler's
    `redispatch_after_s` (its `reconcile:` log lines): a long queue, or a lost message."""
    found: set[int] = set()
    for i in range(controllers):
        log = (root / f"controller{i}.log").read_text(errors="replace")
        for listed in re.findall(r"redispatched=\[([^\]]*)\]", log):
            found.update(int(x) for x in listed.split(",") if x.strip())
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--slots", type=int, default=4, help="CPU slots per worker")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rate", type=float, default=2.0, help="Poisson submissions/s")
    parser.add_argument("--burst", type=int, default=40, help="submitted at once, halfway")
    parser.add_argument("--projects", type=int, default=4)
    parser.add_argument("--api-procs", type=int, default=2)
    parser.add_argument("--controllers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--series", type=int, default=10)
    parser.add_argument("--pgbouncer", default="127.0.0.1:6432", help="host:port")
    parser.add_argument("--seed", type=int, default=0)
    args = smoke.parse(
        parser, workers=2, slots=2, jobs=10, rate=4.0, burst=3, projects=2, api_procs=1,
        steps=6, step_s=0.5, checkpoint_every=3,
    )  # fmt: skip
    args.burst = min(args.burst, args.jobs)
    rng = random.Random(args.seed)
    pg_host, pg_port = args.pgbouncer.rsplit(":", 1)
    pool = f"fleet-{secrets.token_hex(3)}"
    with postgres_database() as direct, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pooled = make_url(direct).set(host=pg_host, port=int(pg_port))
        pooled_url = pooled.render_as_string(hide_password=False)
        storage = root / "storage"
        keys = [project_key(direct)[1] for _ in range(args.projects)]
        engine = create_engine(direct, pool_size=2)
        with contextlib.ExitStack() as stack:
            api_env = _env(root / "api", pooled_url, direct, storage)
            api = stack.enter_context(api_server(api_env, root / "api.log", workers=args.api_procs))
            controllers = [
                stack.enter_context(
                    process([sys.executable, "-m", "workers", "controller"],
                            _env(root / f"controller{i}", pooled_url, direct, storage),
                            root / f"controller{i}.log")
                )
                for i in range(args.controllers)
            ]  # fmt: skip
            workers = []
            for i in range(args.workers):
                name = f"fleet-{i:03d}"
                env = _env(
                    root / name, pooled_url, direct, storage,
                    TORCHYARD_WORKER_SLOTS=str(args.slots), TORCHYARD_WORKER_HOSTNAME=name,
                )  # fmt: skip
                argv = worker_argv(pool, f"{name}@fleet", loglevel="WARNING")
                workers.append(stack.enter_context(process(argv, env, root / f"{name}.log")))
            note(f"{args.workers} workers x {args.slots} slots starting ...")
            _wait_workers(engine, args.workers, 120 + 10 * args.workers)
            body = {key: _spec(_upload_code(api.url, key), pool, args) for key in keys}
            probe = stack.enter_context(Probe(engine, pg_host, int(pg_port)))
            pids = {
                "api": [api.pid],
                "controllers": [c.pid for c in controllers],
                "workers": [w.pid for w in workers],
            }
            cpu0 = {k: [tree_cpu_s(p) for p in v] for k, v in pids.items()}
            note(f"submitting {args.jobs} jobs at {args.rate}/s (+{args.burst} at once) ...")
            at = _schedule(args, rng)
            submit = asyncio.run(submit_stream(api.url, keys, body, at, rng))
            note(f"submit: {submit}")
            per_job = args.steps * args.step_s
            _wait_done(engine, args.jobs, 120 + 3 * per_job * args.jobs / args.workers)
            cpu1 = {k: [tree_cpu_s(p) for p in v] for k, v in pids.items()}
            measured = probe.finish()
            capacity = args.workers * args.slots
            sent_again = _redispatched(root, args.controllers)
            claim = _queue_to_claim(engine, probe.taken_at, capacity, sent_again)
            job_s = _job_seconds(engine)
        engine.dispose()
    per_1000 = 1000 / args.jobs

    def cpu(kind: str, own: bool = False) -> float:
        pairs = zip(cpu0[kind], cpu1[kind], strict=True)
        spent = sum(b[1 if own else 0] - a[1 if own else 0] for a, b in pairs)
        return round(spent * per_1000, 1)

    measured["cpu_s_per_1000_jobs"] = {
        "api": cpu("api"),
        "controllers": cpu("controllers"),
        "workers_own": cpu("workers", own=True),
        "workers_with_jobs": cpu("workers"),
        **{k: round(v * per_1000, 1) for k, v in measured.pop("cpu_s").items()},
    }
    # The workers' own CPU for each second a job ran (claimed -> ended): what a running job
    # costs its worker, whatever the job's length.
    own_s = measured["cpu_s_per_1000_jobs"]["workers_own"] / per_1000
    measured["worker_cpu_ms_per_job_s"] = round(1000 * own_s / job_s, 1) if job_s else None
    emit({
        "bench": "fleet",
        "date": datetime.now(UTC).date().isoformat(),
        "sizes": {"workers": args.workers, "slots": args.slots, "slots_total": capacity,
                  "jobs": args.jobs, "projects": args.projects, "api_procs": args.api_procs,
                  "controllers": args.controllers, "steps": args.steps, "step_s": args.step_s,
                  "series": args.series, "checkpoint_every": args.checkpoint_every},
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "submit": submit,
        "queue_to_claim": claim,
        **measured,
    })  # fmt: skip


if __name__ == "__main__":
    main()
