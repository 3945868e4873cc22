"""The control plane at fleet scale, simulated with the real processes (issue 49).

    python -m bench.fleet [--workers 8] [--slots 4] [--jobs 300] [--rate 2.0] [--burst 40]
                          [--projects 4] [--api-procs 2] [--controllers 2] [--steps 20]
                          [--step-s 0.5] [--checkpoint-every 10] [--series 10]
                          [--kill-workers 2] [--kill-controller 1] [--restart-after-s 5]
                          [--max-restarts 2] [--watchers 200] [--watched-jobs 20]
                          [--plot fleet.png]

Starts, on this host: an API (`uvicorn`, `--api-procs` processes), `--controllers` controllers
(one leads), `--workers` real workers (`celery ... worker`, as `torchyard worker` runs it), each
with `--slots` CPU slots (`TORCHYARD_WORKER_SLOTS`), a home and a name of its own, so the control
plane sees that many hosts; Postgres behind PgBouncer (transaction pooling, `--pgbouncer`) for
the API and workers, the controllers direct (README's Deployment); Redis; storage on an S3
server (`moto`, `bench._fleet_store`; its requests counted). Every job is a real
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
this host only); S3 requests/s.

Faults (`bench._fleet_faults`): `--kill-workers` workers SIGKILLed with their whole process
tree while they run jobs (30% to 70% through the submissions) and started again
`--restart-after-s` later, and the leading controller SIGKILLed halfway; measured: kill ->
requeue of each lost job (its events), the standby's takeover (the `controllers` table), and
every job's end (succeeded, or failed `node_lost` with its `--max-restarts` spent). SSE
(`bench._fleet_watch`): `--watchers` streams on `--watched-jobs` running jobs, delivery p99.
`--plot PATH`: a PNG of queue depth, slots held and claim latency over time
(`bench._fleet_plot`), the run's JSON with its timeline beside it (PATH with `.json`).

Nothing in the product knows it is simulated: the workers are workers, the jobs are jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import random
import secrets
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine
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
)
from bench._fleet_claims import job_seconds, queue_to_claim, redispatched, wait_done, wait_workers
from bench._fleet_faults import CpuBook, Faults
from bench._fleet_plot import plot
from bench._fleet_probe import Probe
from bench._fleet_store import Store, s3_store
from bench._fleet_watch import Watchers
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


def _tar_gz(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, body in files.items():
            data = body.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _env(home: Path, pooled_url: str, direct_url: str, store: Store, **extra: str) -> dict:
    """A process of the deployment: production settings (intervals left at their defaults),
    storage on the S3 server."""
    return {
        **os.environ,
        **store.env,
        "TORCHYARD_ENV": "test",  # loopback Postgres without a password; nothing else differs
        "TORCHYARD_HOME": str(home),
        "TORCHYARD_DATABASE_URL": pooled_url,
        "TORCHYARD_DATABASE_DIRECT_URL": direct_url,
        "TORCHYARD_BROKER_URL": REDIS_URL,
        "TORCHYARD_STORAGE_URL": store.url,
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
        "retries": {"max_restarts": args.max_restarts},
    }


def _fault_times(args: argparse.Namespace, span_s: float) -> tuple[list[float], float | None]:
    """When the faults strike (s after the first submission): the workers spread over the
    middle of the submission span (30% to 70%), the leader at its middle."""
    k = args.kill_workers
    workers = [span_s * (0.3 + 0.4 * i / max(1, k - 1)) for i in range(k)]
    return workers, (span_s * 0.5 if args.kill_controller else None)


def _arguments() -> argparse.Namespace:
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
    parser.add_argument("--max-restarts", type=int, default=2, help="each job's retry budget")
    parser.add_argument("--kill-workers", type=int, default=2, help="SIGKILLed, restarted")
    parser.add_argument("--kill-controller", type=int, default=1, choices=(0, 1))
    parser.add_argument("--restart-after-s", type=float, default=5.0)
    parser.add_argument("--watchers", type=int, default=200, help="SSE streams")
    parser.add_argument("--watched-jobs", type=int, default=20, help="running jobs watched")
    parser.add_argument("--plot", type=Path, help="a PNG here, the run's JSON beside it")
    parser.add_argument("--pgbouncer", default="127.0.0.1:6432", help="host:port")
    parser.add_argument("--seed", type=int, default=0)
    args = smoke.parse(
        parser, workers=2, slots=2, jobs=10, rate=4.0, burst=3, projects=2, api_procs=1,
        steps=6, step_s=0.5, checkpoint_every=3, kill_workers=1, restart_after_s=1.0,
        watchers=4, watched_jobs=2,
    )  # fmt: skip
    args.burst = min(args.burst, args.jobs)
    args.kill_workers = min(args.kill_workers, args.workers)
    return args


def main() -> None:
    args = _arguments()
    rng = random.Random(args.seed)
    pg_host, pg_port = args.pgbouncer.rsplit(":", 1)
    pool = f"fleet-{secrets.token_hex(3)}"
    capacity = args.workers * args.slots
    with (
        postgres_database() as direct,
        tempfile.TemporaryDirectory() as tmp,
        s3_store(Path(tmp)) as store,
    ):
        root = Path(tmp)
        pooled = make_url(direct).set(host=pg_host, port=int(pg_port))
        pooled_url = pooled.render_as_string(hide_password=False)
        projects = dict(project_key(direct) for _ in range(args.projects))
        keys = list(projects.values())
        engine = create_engine(direct, pool_size=4)
        with contextlib.ExitStack() as stack:
            api_env = _env(root / "api", pooled_url, direct, store)
            api = stack.enter_context(api_server(api_env, root / "api.log", workers=args.api_procs))
            controllers = [
                stack.enter_context(
                    process([sys.executable, "-m", "workers", "controller"],
                            _env(root / f"controller{i}", pooled_url, direct, store),
                            root / f"controller{i}.log")
                )
                for i in range(args.controllers)
            ]  # fmt: skip
            names = [f"fleet-{i:03d}" for i in range(args.workers)]

            def start_worker(i: int) -> Any:
                env = _env(
                    root / names[i], pooled_url, direct, store,
                    TORCHYARD_WORKER_SLOTS=str(args.slots), TORCHYARD_WORKER_HOSTNAME=names[i],
                )  # fmt: skip
                argv = worker_argv(pool, f"{names[i]}@fleet", loglevel="WARNING")
                log = root / f"{names[i]}-{time.monotonic_ns()}.log"  # one per start
                return stack.enter_context(process(argv, env, log))

            workers = [start_worker(i) for i in range(args.workers)]
            note(f"{args.workers} workers x {args.slots} slots starting ...")
            wait_workers(engine, args.workers, 120 + 10 * args.workers)
            body = {key: _spec(_upload_code(api.url, key), pool, args) for key in keys}
            probe = stack.enter_context(Probe(engine, pg_host, int(pg_port)))
            book = CpuBook({
                "api": [api.pid],
                "controllers": [c.pid for c in controllers],
                "workers": [w.pid for w in workers],
            })  # fmt: skip
            s3_before = store.requests()
            at = _schedule(args, rng)
            worker_at, controller_at = _fault_times(args, at[-1] if at else 0.0)
            faults = Faults(
                engine, workers, names, controllers, start_worker, book,
                worker_at, controller_at, args.restart_after_s,
            )  # fmt: skip
            per_job = args.steps * args.step_s
            watch = Watchers(
                engine, api.url, projects, args.watchers, args.watched_jobs,
                wait_s=at[-1] / 2 if at else 0.0, deadline_s=10 * per_job + 120,
            ).start()  # fmt: skip
            note(f"submitting {args.jobs} jobs at {args.rate}/s (+{args.burst} at once) ...")
            started = time.time()
            fault_thread = faults.start()
            submit = asyncio.run(submit_stream(api.url, keys, body, at, rng))
            note(f"submit: {submit}")
            wait_done(engine, args.jobs, 120 + 3 * per_job * args.jobs / args.workers)
            fault_thread.join(180)
            spent = {kind: book.spent(kind) for kind in ("api", "controllers", "workers")}
            measured = probe.finish()
            s3_after = store.requests()
            sent_again = redispatched(root, args.controllers)
            claim, claims = queue_to_claim(engine, probe.taken_at, capacity, sent_again)
            job_s = job_seconds(engine)
            sse = watch.finish()
            fault_figures = faults.figures(args.max_restarts)
        engine.dispose()
    document = _document(args, submit, claim, measured, spent, job_s)
    document["s3"] = _s3_figures(s3_before, s3_after, measured["seconds"], args.jobs)
    document["sse"] = sse
    document["faults"] = fault_figures
    if args.plot is not None:
        fault_marks = [(k["at"].timestamp() - started, f"kill {k['worker']}") for k in faults.kills]
        if faults.takeover is not None:
            killed_at = datetime.fromisoformat(faults.takeover["at"]).timestamp()
            fault_marks.append((killed_at - started, "kill leader"))
        document["timeline"] = {
            "slots_total": capacity,
            "samples": [(round(t - started, 2), q, h) for t, q, h in probe.timeline],
            "claims": [(round(t - started, 2), round(w, 3), p) for t, w, p in claims],
            "faults": [(round(t, 2), what) for t, what in fault_marks],
        }
        args.plot.with_suffix(".json").write_text(json.dumps(document, indent=2))
        sizes = document["sizes"]
        title = (f"bench.fleet {document['date']}: {sizes['workers']} workers x {sizes['slots']}"
                 f" slots, {sizes['jobs']} jobs")  # fmt: skip
        plot(args.plot, document["timeline"], title)
        del document["timeline"]
    emit(document)


def _s3_figures(before: Any, after: Any, seconds: float, jobs: int) -> dict[str, Any]:
    spent = after - before
    total = sum(n for method, n in spent.items() if method != "status_ge_400")
    return {
        "requests": total,
        "requests_per_s": round(total / seconds, 1) if seconds else None,
        "per_job": round(total / jobs, 1),
        "by_method": {k: v for k, v in sorted(spent.items()) if k != "status_ge_400"},
        "status_ge_400": spent.get("status_ge_400", 0),
    }


def _document(
    args: argparse.Namespace, submit: dict[str, Any], claim: dict[str, Any],
    measured: dict[str, Any], spent: dict[str, tuple[float, float]], job_s: float,
) -> dict[str, Any]:  # fmt: skip
    per_1000 = 1000 / args.jobs
    measured["cpu_s_per_1000_jobs"] = {
        "api": round(spent["api"][0] * per_1000, 1),
        "controllers": round(spent["controllers"][0] * per_1000, 1),
        "workers_own": round(spent["workers"][1] * per_1000, 1),
        "workers_with_jobs": round(spent["workers"][0] * per_1000, 1),
        **{k: round(v * per_1000, 1) for k, v in measured.pop("cpu_s").items()},
    }
    # The workers' own CPU for each second a job ran (claimed -> ended): what a running job
    # costs its worker, whatever the job's length.
    own_s = spent["workers"][1]
    measured["worker_cpu_ms_per_job_s"] = round(1000 * own_s / job_s, 1) if job_s else None
    return {
        "bench": "fleet",
        "date": datetime.now(UTC).date().isoformat(),
        "sizes": {"workers": args.workers, "slots": args.slots,
                  "slots_total": args.workers * args.slots, "jobs": args.jobs,
                  "projects": args.projects, "api_procs": args.api_procs,
                  "controllers": args.controllers, "steps": args.steps, "step_s": args.step_s,
                  "series": args.series, "checkpoint_every": args.checkpoint_every,
                  "max_restarts": args.max_restarts, "workers_killed": args.kill_workers,
                  "controller_killed": bool(args.kill_controller), "watchers": args.watchers},
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "submit": submit,
        "queue_to_claim": claim,
        **measured,
    }  # fmt: skip


if __name__ == "__main__":
    main()
