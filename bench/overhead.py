"""What the platform costs a job: the same tiny spec trained by bare `torchrun -m trainer` and
through the API + a Celery worker (uvicorn + Postgres + Redis, loopback).

    python -m bench.overhead [--steps 200] [--repeats 2]

Bare is `torchrun` with the worker's own command line and environment builders
(`workers.launcher.torchrun_argv` / `trainer_env`, one OpenMP thread), as a user runs it by
hand; the worker runs the same one-process job without torchrun
(`workers.lone_rank`), so "to first step" also shows what that saves. Steps/s
comes from the trainer's own metric-line times (first to last `loss` line); "to first step"
is wall time from launch (bare: `Popen`; platform: the `POST /v1/jobs` request) to the
trainer's `time` of its first metric line. The two are
interleaved `--repeats` times and the medians reported (the host is shared and noisy).
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from bench import smoke
from bench._common import (
    api_server,
    emit,
    note,
    postgres_database,
    project_key,
    server_env,
    tiny_spec,
    wait_for,
    worker,
)
from core.platform.db import make_engine
from core.platform.tables import Job, MetricPoint
from workers.launcher import RunPaths, free_port, torchrun_argv, trainer_env


def _rate(points: list[tuple[int, float]]) -> float:
    """Optimizer steps per second between the first and the last (step, time)."""
    (s0, t0), (s1, t1) = points[0], points[-1]
    return (s1 - s0) / (t1 - t0)


def bare(home: Path, spec: dict[str, Any], corpus: Path) -> dict[str, float]:
    run_dir = home / f"bare-{secrets.token_hex(3)}"
    paths = RunPaths(run_dir=run_dir, checkpoint_dir=str(run_dir / "ckpt"), data=str(corpus))
    paths.log_dir.mkdir(parents=True)
    bare_spec = {**spec, "data": {"uri": str(corpus)}}
    paths.spec.write_text(json.dumps(bare_spec))
    argv = torchrun_argv(job_id=0, attempt=1, nproc_per_node=1, rdzv_port=free_port(),
                         paths=paths)  # fmt: skip
    env = trainer_env(base={**os.environ, "OMP_NUM_THREADS": "1"}, attempt=1,
                      nproc_per_node=1, device="cpu", cpu_count=os.cpu_count())  # fmt: skip
    launched = time.time()
    with (run_dir / "torchrun.log").open("wb") as log:
        done = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bare torchrun exited {done.returncode}; see {run_dir}")
    points = []
    for raw in paths.events.read_text().splitlines():
        event = json.loads(raw)
        if event["type"] == "metric" and "loss" in event["values"]:
            points.append((int(event["step"]), float(event["time"])))
    return {"steps_per_s": _rate(points), "to_first_step_s": points[0][1] - launched}


def platform(home: Path, url: str, spec: dict[str, Any], corpus: Path) -> dict[str, float]:
    home = home / f"platform-{secrets.token_hex(3)}"
    home.mkdir()
    _, key = project_key(url)
    env = server_env(url, home, TORCHYARD_DATA_ROOTS=json.dumps([str(corpus)]))
    engine = make_engine(url)
    headers = {"Authorization": f"Bearer {key}"}
    with (
        api_server(env, home / "uvicorn.log") as server,
        worker(env, spec["resources"]["pool"], home / "worker.log"),
        httpx.Client(base_url=server.url, headers=headers, timeout=60) as http,
    ):
        ds = http.post("/v1/datasets", json={"name": "corpus", "uri": str(corpus)})
        ds.raise_for_status()
        submitted = time.time()
        job = http.post("/v1/jobs", json={**spec, "data": {"dataset": ds.json()["id"]}}).json()

        def finished() -> Job | None:
            with Session(engine) as s:
                row = s.get(Job, job["id"])
                return row if row is not None and row.finished_at is not None else None

        row = wait_for(finished, 170, "the job to finish", poll_s=0.5)
        if row.state != "succeeded":
            raise RuntimeError(f"job {row.state}: {row.error}; see {home}/worker.log")
        with Session(engine) as s:
            points = [
                (int(step), float(t))
                for step, t in s.execute(
                    select(MetricPoint.step, MetricPoint.time)
                    .where(MetricPoint.job_id == job["id"], MetricPoint.name == "loss")
                    .order_by(MetricPoint.step)
                )
            ]
    engine.dispose()
    return {"steps_per_s": _rate(points), "to_first_step_s": points[0][1] - submitted}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    args = smoke.parse(parser, steps=4, repeats=1)
    runs: dict[str, list[dict[str, float]]] = {"bare": [], "platform": []}
    with postgres_database() as url, tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        corpus = home / "corpus"
        corpus.mkdir()
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        for src in sorted(stdlib.glob("*.py"))[:40]:
            (corpus / src.name).write_bytes(src.read_bytes())
        spec = tiny_spec("x", pool=f"bench-{secrets.token_hex(3)}", max_steps=args.steps)
        for i in range(args.repeats):
            runs["bare"].append(bare(home, spec, corpus))
            note(f"bare {i}: {runs['bare'][-1]}")
            runs["platform"].append(platform(home, url, spec, corpus))
            note(f"platform {i}: {runs['platform'][-1]}")
    b, p = (
        {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]}
        for name in ("bare", "platform")
    )
    emit(
        {
            "bench": "overhead",
            "steps": args.steps,
            "repeats": args.repeats,
            "bare": {k: round(v, 3) for k, v in b.items()},
            "platform": {k: round(v, 3) for k, v in p.items()},
            "steps_per_s_ratio": round(p["steps_per_s"] / b["steps_per_s"], 3),
            "extra_to_first_step_s": round(p["to_first_step_s"] - b["to_first_step_s"], 3),
            "goals": {"steps_per_s_ratio": 0.98, "extra_to_first_step_s": 1.0},
        }
    )


if __name__ == "__main__":
    main()
