"""`GET /v1/jobs/{id}/metrics` without `max_points`: every point of each series asked for, in
step order, within `start`..`end`; unknown names are absent."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from core.jobs import upserts
from core.platform.db import session_scope
from core.platform.tables import Job
from tests.conftest import ProjectKey
from tests.integration.api.conftest import job_spec, submit
from tests.integration.workers.helpers import wait_for


def test_every_point_of_the_named_series_within_the_step_range_in_step_order(
    client: TestClient, engine: Engine, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    job_id = submit(client, project, job_spec(dataset["id"]))["id"]
    points = [
        upserts.Metric(name, step, step * scale, 1.0)
        for name, scale in (("loss", 0.5), ("lr", 0.01), ("eval_loss", 2.0))
        for step in (7, 1, 3, 5, 9)  # stored out of order
    ]
    with session_scope(engine) as s:
        upserts.metrics(session=s, job_id=job_id, attempt=1, points=points)

    def series(**params: Any) -> dict[str, Any]:
        answer = client.get(f"/v1/jobs/{job_id}/metrics", params=params, headers=project.headers)
        assert answer.status_code == 200, answer.text
        return {s["name"]: s for s in answer.json()["series"]}

    every = series()
    assert sorted(every) == ["eval_loss", "loss", "lr"]
    assert every["loss"]["steps"] == [1, 3, 5, 7, 9]
    assert every["loss"]["values"] == [0.5, 1.5, 2.5, 3.5, 4.5]
    assert every["loss"]["last"] == {"step": 9, "value": 4.5}
    picked = series(names="lr,eval_loss,nope", start=3, end=7)
    assert sorted(picked) == ["eval_loss", "lr"]
    assert picked["eval_loss"]["steps"] == [3, 5, 7]
    assert picked["eval_loss"]["values"] == [6.0, 10.0, 14.0]
    assert series(names="loss", start=10) == {}


def test_two_nodes_ingesting_at_once_never_lower_the_jobs_current_step(
    client: TestClient, engine: Engine, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    """A gang's nodes flush into one job at once: node 0 its loss at step 16 (not yet
    committed), node 1 its `sys/*` sample at step 13 meanwhile. The second waits for the
    first's row lock and must not write back the step it read before (it did: 13)."""
    job_id = submit(client, project, job_spec(dataset["id"]))["id"]
    with session_scope(engine) as s:
        upserts.metrics(
            session=s, job_id=job_id, attempt=1, points=[upserts.Metric("loss", 12, 1.0, 1.0)]
        )
    first = Session(engine)
    upserts.metrics(
        session=first, job_id=job_id, attempt=1, points=[upserts.Metric("loss", 16, 0.5, 2.0)]
    )

    def second() -> None:
        with session_scope(engine) as s:
            sample = upserts.Metric("sys/rss_bytes/node1", 13, 1e9, 2.0)
            upserts.metrics(session=s, job_id=job_id, attempt=1, points=[sample])

    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(second)

        def waiting() -> bool:  # the second flush blocks on the first's lock of the job row
            with engine.connect() as c:
                query = (
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
                return bool(c.execute(text(query)).scalar())

        wait_for("the second flush to wait for the row lock", waiting, 30)
        first.commit()
        first.close()
        done.result(timeout=30)
    with session_scope(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.current_step == 16
        assert job.latest_metrics is not None and set(job.latest_metrics) == {
            "loss",
            "sys/rss_bytes/node1",
        }
