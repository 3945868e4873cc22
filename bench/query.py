"""Read latency at scale, through uvicorn + Postgres: a 1,000,000-point series downsampled to
1,000 points, and the jobs list (first page and a deep page) with 100,000 jobs in the DB.

    python -m bench.query [--points 1000000] [--jobs 100000] [--requests 100]

Prints one JSON document. The rows are generated inside Postgres (`generate_series`; the
trigger of migration 0003 rolls them up into `metric_rollups` as it does for the worker's
COPY); the ingest path has its own bench (`bench.ingest`).
"""

from __future__ import annotations

import argparse
import base64
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from bench import smoke
from bench._common import (
    api_server,
    emit,
    note,
    postgres_database,
    project_key,
    server_env,
    stored_spec,
    summary_ms,
)
from core.platform.db import make_engine

_JOBS = """
INSERT INTO jobs (project_id, name, state, spec, labels, pool, priority, attempt,
                  created_at, updated_at, max_steps, latest_metrics)
SELECT :project, 'job-' || g, CASE WHEN g % 50 = 0 THEN 'failed' ELSE 'succeeded' END,
       CAST(:spec AS jsonb), CASE WHEN g % 10 = 0 THEN '{"team": "nlp"}' ELSE '{}' END::jsonb,
       'default', 0, 1,
       now(), now(), 100, '{}'::jsonb
FROM generate_series(1, :n) AS g
"""
_POINTS = """
INSERT INTO metric_points (job_id, name, step, value, attempt, time)
SELECT :job, 'loss', g, 4.0 * exp(-g / 200000.0) + 0.1 * random()
       + CASE WHEN g = 777777 THEN 50 ELSE 0 END, 1, g
FROM generate_series(1, :n) AS g
"""


def _timed(
    http: httpx.Client, url: str, params: dict[str, Any], n: int, vary: str | None = None
) -> list[float]:
    """Latencies of `n` GETs; `vary`: a parameter made distinct per request (cache misses)."""
    out = []
    for i in range(n):
        start = time.perf_counter()
        answer = http.get(url, params={**params, vary: params[vary] - i} if vary else params)
        out.append(time.perf_counter() - start)
        answer.raise_for_status()
    return out


def _cursor(sort: str, value: str, job_id: int) -> str:
    raw = json.dumps({"sort": sort, "value": value, "id": job_id}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _sorted_pages(http: httpx.Client, n: int, first_id: int) -> dict[str, Any]:
    """The dashboard's other listings: sorted by name (first page, and one deep in the order),
    and filtered by a label that one job in ten has."""
    out: dict[str, Any] = {}
    for sort in ("name", "-name"):
        _timed(http, "/v1/jobs", {"limit": 50, "sort": sort}, 2)
        out[f"jobs_list_sort_{sort}_first_page"] = summary_ms(
            _timed(http, "/v1/jobs", {"limit": 50, "sort": sort}, n)
        )
    deep = {"limit": 50, "sort": "name", "cursor": _cursor("name", "job-9", first_id + 8)}
    out["jobs_list_sort_name_deep_page"] = summary_ms(_timed(http, "/v1/jobs", deep, n))
    label = {"limit": 50, "label": "team=nlp"}
    out["jobs_list_label_filter_first_page"] = summary_ms(_timed(http, "/v1/jobs", label, n))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=100)
    args = smoke.parse(parser, points=5_000, jobs=500, requests=4)
    with postgres_database() as url, tempfile.TemporaryDirectory() as home:
        project, key = project_key(url)
        engine = make_engine(url)
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(text(_JOBS), {"project": project, "n": args.jobs, "spec": stored_spec()})
            job_id = conn.scalar(text("SELECT max(id) FROM jobs"))
            first_id = conn.scalar(text("SELECT min(id) FROM jobs"))
            conn.execute(text(_POINTS), {"job": job_id, "n": args.points})
            conn.execute(
                text("UPDATE jobs SET latest_metrics = jsonb_build_object('loss', 1.0), "
                     "current_step = :n WHERE id = :job"),
                {"job": job_id, "n": args.points},
            )  # fmt: skip
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE metric_points"))
            conn.execute(text("VACUUM ANALYZE metric_rollups"))
            conn.execute(text("VACUUM ANALYZE jobs"))
        load_s = time.perf_counter() - started
        note(f"loaded {args.jobs} jobs and {args.points} points in {load_s:.1f} s")
        env = server_env(url, Path(home))
        with api_server(env, Path(home) / "uvicorn.log") as server:
            headers = {"Authorization": f"Bearer {key}"}
            with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
                metrics_url = f"/v1/jobs/{job_id}/metrics"
                params = {"names": "loss", "max_points": 1000, "end": args.points}
                _timed(http, metrics_url, params, 3)  # warm the caches
                cold = _timed(http, metrics_url, params, args.requests // 2, vary="end")
                downsampled = _timed(http, metrics_url, params, args.requests)
                body = http.get(metrics_url, params=params).json()["series"][0]
                full_s = _timed(http, metrics_url, {"names": "loss"}, 1)[0]
                _timed(http, "/v1/jobs", {"limit": 50}, 3)
                first = _timed(http, "/v1/jobs", {"limit": 50}, args.requests)
                cursor = base64.urlsafe_b64encode(
                    json.dumps({"before_id": first_id + 100}).encode()
                ).decode().rstrip("=")  # fmt: skip
                deep = _timed(http, "/v1/jobs", {"limit": 50, "cursor": cursor}, args.requests)
                sorted_pages = _sorted_pages(http, args.requests, first_id)
    emit(
        {
            "bench": "query",
            "points_in_series": args.points,
            "jobs_in_db": args.jobs,
            "downsampled_to_1000_uncached": summary_ms(cold),
            "downsampled_to_1000": {
                **summary_ms(downsampled),
                "points_returned": len(body["steps"]),
                "spike_kept": 777777 in body["steps"],
                "last_exact": body["last"] == {"step": args.points, "value": body["values"][-1]},
            },
            "full_series_once_ms": round(full_s * 1000, 1),
            "jobs_list_first_page": summary_ms(first),
            "jobs_list_deep_page": summary_ms(deep),
            **sorted_pages,
            "goals": {"downsampled_p99_ms": 10, "jobs_list_p99_ms": 10},
        }
    )


if __name__ == "__main__":
    main()
