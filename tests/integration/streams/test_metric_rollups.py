"""The metric rollups on Postgres (migration 0004): exact after any mix of new points and
re-ingested ones, read by downsampled queries, deleted with their job, backfilled on upgrade."""

from __future__ import annotations

import math
import random
import secrets
from typing import Any

from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from core.jobs import reports as queries
from core.jobs import upserts
from core.jobs.downsample import LEVEL_SHIFTS, grid, min_max, num_buckets
from core.platform.db import alembic_config, make_engine, session_scope
from tests.conftest import PG_ADMIN_URL, ProjectKey

Block = tuple[int, float, int, float]  # min_step, min_value, max_step, max_value


def _store(engine: Engine, job_id: int, points: list[upserts.Metric]) -> None:
    with session_scope(engine) as s:
        upserts.metrics(session=s, job_id=job_id, attempt=1, points=points)


def _expected(points: dict[int, float]) -> dict[tuple[int, int], Block]:
    """(level, bucket) -> extremes, from the points themselves (ties: earliest step)."""
    out: dict[tuple[int, int], Block] = {}
    for level, shift in enumerate(LEVEL_SHIFTS, start=1):
        for step in sorted(points):
            value, key = points[step], (level, step >> shift)
            lo_s, lo_v, hi_s, hi_v = out.get(key, (step, value, step, value))
            if value < lo_v:
                lo_s, lo_v = step, value
            if value > hi_v:
                hi_s, hi_v = step, value
            out[key] = (lo_s, lo_v, hi_s, hi_v)
    return out


def _stored(engine: Engine, job_id: int, name: str) -> dict[tuple[int, int], Block]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT level, bucket, min_step, min_value, max_step, max_value"
                " FROM metric_rollups WHERE job_id = :job AND name = :name"
            ),
            {"job": job_id, "name": name},
        )
        return {(r[0], r[1]): (r[2], r[3], r[4], r[5]) for r in rows}


def test_rollups_stay_exact_through_reingest_overwrites_and_mixed_batches(
    engine: Engine, job: dict[str, Any]
) -> None:
    rng = random.Random(3)
    truth = {step: rng.uniform(0, 1) for step in range(0, 3000)}
    truth[1234] = 50.0  # a spike that a later overwrite removes
    del truth[10]  # a gap, filled in at the end
    first = [upserts.Metric("loss", s, v, 1.0) for s, v in truth.items()]
    _store(engine, job["id"], first[:2000])  # new points: COPY, merged into the blocks
    _store(engine, job["id"], first[1000:])  # half stored again, half new, one statement each
    _store(engine, job["id"], first)  # a full re-read changes nothing
    assert _stored(engine, job["id"], "loss") == _expected(truth)
    # A resumed attempt reports steps 1200.. again with other values: blocks recomputed, the
    # old spike is gone and nothing is counted twice.
    again = {step: truth[step] / 2 for step in range(1200, 2600)}
    truth |= again
    _store(engine, job["id"], [upserts.Metric("loss", s, v, 2.0) for s, v in again.items()])
    rollups = _stored(engine, job["id"], "loss")
    assert rollups == _expected(truth)
    assert max(b[3] for b in rollups.values()) < 50.0
    # Points past the end and the gap filled in, in one batch (the gap goes through the upsert).
    extra = {10: -7.0, 5000: 3.0, 5001: -2.0}
    truth |= extra
    _store(engine, job["id"], [upserts.Metric("loss", s, v, 3.0) for s, v in extra.items()])
    assert _stored(engine, job["id"], "loss") == _expected(truth)


def test_downsampled_queries_read_the_rollups_and_match_the_reference(
    client: TestClient, project: ProjectKey, job: dict[str, Any], engine: Engine
) -> None:
    n = 60_000
    rng = random.Random(5)
    values = [4.0 * math.exp(-s / 20_000) + rng.uniform(0, 0.1) for s in range(n)]
    values[41_017], values[7_003] = 80.0, -5.0  # one-step spike and dip
    _store(engine, job["id"], [upserts.Metric("loss", s, v, 0.0) for s, v in enumerate(values)])
    url = f"/v1/jobs/{job['id']}/metrics"
    cases = [(None, None, 1000), (None, None, 200), (123, 54_321, 301), (7_003, 41_017, 64)]
    levels = set()
    for start, end, max_points in cases:
        params = {"names": "loss", "max_points": max_points}
        params |= {"start": start, "end": end} if start is not None else {}
        (loss,) = client.get(url, params=params, headers=project.headers).json()["series"]
        lo, hi = start or 0, end if end is not None else n - 1
        expected = min_max(list(range(lo, hi + 1)), values[lo : hi + 1], max_points)
        assert (loss["steps"], loss["values"]) == expected
        assert len(loss["steps"]) <= max_points
        assert loss["last"] == {"step": hi, "value": values[hi]}
        assert {7_003, 41_017} <= set(loss["steps"])
        levels.add(grid(lo, hi, num_buckets(max_points)).level)
    assert max(levels) >= 2  # the rollup path was taken, at more than one level
    # The query really reads the rollups: a block's maximum changed behind the trigger's back
    # shows up in the answer.
    cut = grid(0, n - 1, num_buckets(150))
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE metric_rollups SET max_value = 999.0 WHERE job_id = :j AND name = 'loss'"
                " AND level = :level AND bucket = :bucket"
            ),
            {"j": job["id"], "level": cut.level, "bucket": (20_000 >> cut.shift)},
        )
    with session_scope(engine) as s:
        (series,) = queries.downsampled_series(session=s, job_id=job["id"], max_points=150)
    assert 999.0 in series.values


def test_a_sparse_series_that_fits_comes_back_whole(
    client: TestClient, project: ProjectKey, job: dict[str, Any], engine: Engine
) -> None:
    points = [upserts.Metric("eval_loss", s, 1.0 / (s + 1), 0.0) for s in range(0, 500_000, 1000)]
    _store(engine, job["id"], points)
    (series,) = client.get(
        f"/v1/jobs/{job['id']}/metrics",
        params={"names": "eval_loss", "max_points": 500},
        headers=project.headers,
    ).json()["series"]
    assert series["steps"] == [p.step for p in points]


def test_deleting_a_job_deletes_its_points_and_rollups(engine: Engine, job: dict[str, Any]) -> None:
    _store(engine, job["id"], [upserts.Metric("loss", s, float(s), 0.0) for s in range(100)])
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs WHERE id = :j"), {"j": job["id"]})
        left = [
            conn.scalar(text(f"SELECT count(*) FROM {table} WHERE job_id = :j"), {"j": job["id"]})
            for table in ("metric_points", "metric_rollups")
        ]
    assert left == [0, 0]


def test_upgrading_to_0004_rolls_up_the_points_already_stored() -> None:
    name = f"torchyard_test_{secrets.token_hex(4)}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        command.upgrade(alembic_config(url), "0002")
        engine = make_engine(url)
        truth = {step: math.sin(step / 50.0) for step in range(0, 5000, 3)}
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO projects VALUES ('p', 'p', now())"))
            job_id = conn.scalar(
                text(
                    "INSERT INTO jobs (project_id, name, state, spec, labels, pool, priority,"
                    " attempt, created_at, updated_at, max_steps, latest_metrics) VALUES"
                    " ('p', 'j', 'queued', '{}', '{}', 'p', 0, 0, now(), now(), 1, '{}')"
                    " RETURNING id"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO metric_points (job_id, name, step, value, attempt, time)"
                    " VALUES (:job, 'loss', :step, :value, 1, 0)"
                ),
                [{"job": job_id, "step": s, "value": v} for s, v in truth.items()],
            )
        command.upgrade(alembic_config(url), "0004")
        assert _stored(engine, job_id, "loss") == _expected(truth)
        engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
