"""Downsampled metric queries on Postgres, and idempotent metric ingestion."""

from __future__ import annotations

import math
import random
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from core.jobs import upserts
from core.jobs.downsample import min_max
from core.platform.db import session_scope
from core.platform.tables import MetricPoint
from tests.conftest import ProjectKey

N = 20_000


def _store(engine: Engine, job_id: int, points: list[upserts.Metric]) -> None:
    with session_scope(engine) as s:
        upserts.metrics(session=s, job_id=job_id, attempt=1, points=points)


def _loss(seed: int = 1) -> list[upserts.Metric]:
    rng = random.Random(seed)
    points = [
        upserts.Metric("loss", step, 4.0 * math.exp(-step / 5000) + rng.uniform(0, 0.1), 0.0)
        for step in range(1, N + 1)
    ]
    points[12_344] = upserts.Metric("loss", 12_345, 99.0, 0.0)  # a one-step spike
    points[6_000] = upserts.Metric("loss", 6_001, -1.0, 0.0)  # and a dip
    return points


def test_downsampled_series_keeps_shape_envelope_and_exact_last_point(
    client: TestClient, project: ProjectKey, job: dict[str, Any], engine: Engine
) -> None:
    points = _loss()
    _store(engine, job["id"], [*points, upserts.Metric("lr", 1, 1e-3, 0.0)])
    answer = client.get(
        f"/v1/jobs/{job['id']}/metrics",
        params={"max_points": 200},
        headers=project.headers,
    )
    assert answer.status_code == 200, answer.text
    series = {s["name"]: s for s in answer.json()["series"]}
    loss = series["loss"]
    assert len(loss["steps"]) <= 200
    assert loss["last"] == {"step": N, "value": points[-1].value}
    assert (loss["steps"][-1], loss["values"][-1]) == (N, points[-1].value)
    pairs = set(zip(loss["steps"], loss["values"], strict=True))
    assert (12_345, 99.0) in pairs and (6_001, -1.0) in pairs
    # The SQL path is the portable Python rule, point for point.
    expected = min_max([p.step for p in points], [p.value for p in points], 200)
    assert (loss["steps"], loss["values"]) == expected
    assert series["lr"]["steps"] == [1]


def test_downsampling_a_step_range(
    client: TestClient, project: ProjectKey, job: dict[str, Any], engine: Engine
) -> None:
    points = _loss(seed=2)
    _store(engine, job["id"], points)
    answer = client.get(
        f"/v1/jobs/{job['id']}/metrics",
        params={"names": "loss", "start": 5000, "end": 15000, "max_points": 101},
        headers=project.headers,
    ).json()
    (loss,) = answer["series"]
    assert loss["steps"][0] == 5000 and loss["steps"][-1] == 15000
    assert len(loss["steps"]) <= 101
    window = [p for p in points if 5000 <= p.step <= 15000]
    expected = min_max([p.step for p in window], [p.value for p in window], 101)
    assert (loss["steps"], loss["values"]) == expected
    # Without max_points the range is every point, as before.
    full = client.get(
        f"/v1/jobs/{job['id']}/metrics",
        params={"names": "loss", "start": 10, "end": 19},
        headers=project.headers,
    ).json()["series"][0]
    assert full["steps"] == list(range(10, 20))


def test_reingesting_the_same_points_stores_them_once(
    client: TestClient, project: ProjectKey, job: dict[str, Any], engine: Engine
) -> None:
    points = [upserts.Metric("loss", step, 1.0 / step, float(step)) for step in range(1, 1001)]
    _store(engine, job["id"], points)
    _store(engine, job["id"], points)  # a worker that re-read events.jsonl after a crash
    _store(engine, job["id"], points[500:])
    _store(engine, job["id"], [*points[:10], *points[:10]])  # one batch holding a key twice
    with engine.connect() as conn:
        stored = conn.scalar(
            select(func.count()).select_from(MetricPoint).where(MetricPoint.job_id == job["id"])
        )
    assert stored == 1000
    loss = client.get(f"/v1/jobs/{job['id']}/metrics", headers=project.headers).json()["series"]
    assert loss[0]["steps"] == list(range(1, 1001))


def test_times_give_each_points_wall_clock_downsampled_or_not(
    client: TestClient, project: ProjectKey, job: dict[str, Any], engine: Engine
) -> None:
    # Reported every step at 1,000 + 0.5 s x step (the trainer's clock, unix seconds).
    points = [upserts.Metric("loss", step, 1.0 / step, 1000 + 0.5 * step) for step in range(1, N)]
    _store(engine, job["id"], points)
    url = f"/v1/jobs/{job['id']}/metrics"
    plain = client.get(url, params={"max_points": 50}, headers=project.headers).json()
    assert "times" not in plain["series"][0]  # as before unless asked
    for params in ({"max_points": 50, "times": "true"}, {"start": 7, "end": 9, "times": "true"}):
        (loss,) = client.get(url, params=params, headers=project.headers).json()["series"]
        assert loss["times"] == [1000 + 0.5 * step for step in loss["steps"]], params
    assert loss["steps"] == [7, 8, 9]
