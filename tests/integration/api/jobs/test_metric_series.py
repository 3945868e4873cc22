"""`GET /v1/jobs/{id}/metrics` without `max_points`: every point of each series asked for, in
step order, within `start`..`end`; unknown names are absent."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from core.jobs import ingest
from core.platform.db import session_scope
from tests.conftest import ProjectKey
from tests.integration.api.conftest import job_spec, submit


def test_every_point_of_the_named_series_within_the_step_range_in_step_order(
    client: TestClient, engine: Engine, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    job_id = submit(client, project, job_spec(dataset["id"]))["id"]
    points = [
        ingest.Metric(name, step, step * scale, 1.0)
        for name, scale in (("loss", 0.5), ("lr", 0.01), ("eval_loss", 2.0))
        for step in (7, 1, 3, 5, 9)  # stored out of order
    ]
    with session_scope(engine) as s:
        ingest.metrics(session=s, job_id=job_id, attempt=1, points=points)

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
