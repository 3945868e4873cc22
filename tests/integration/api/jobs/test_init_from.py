"""`model.init_from` at submission: the source job/checkpoint must be of the caller's project
and complete; `{job}` is pinned to that job's latest complete checkpoint (real Postgres)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.jobs import init_from, upserts
from core.platform.errors import InvalidInput
from core.platform.tables import Checkpoint
from jobspec.job import InitFromSpec
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, counts, job_spec, submit

LOC = ["body", "model", "init_from"]


def _with_checkpoints(engine: Engine, job_id: int, steps: list[int]) -> dict[int, int]:
    """Record complete checkpoints of `job_id` as the worker's ingestion does: {step: id}."""
    with Session(engine) as session:
        for step in steps:
            upserts.checkpoint(
                session=session,
                job_id=job_id,
                attempt=1,
                step=step,
                uri=f"/ckpt/jobs/{job_id}/step_{step:08d}",
                size_bytes=1,
            )
        session.commit()
    return {c["step"]: c["id"] for c in _checkpoints(engine, job_id)}


def _checkpoints(engine: Engine, job_id: int) -> list[dict[str, Any]]:
    with Session(engine) as session:
        rows = session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id))
        return [{"id": r.id, "step": r.step} for r in rows]


def _fine_tune(dataset_id: str, pool: str, **init_from: int) -> dict[str, Any]:
    return job_spec(dataset_id, model={"init_from": init_from}, resources={"pool": pool})


def test_init_from_a_job_pins_its_latest_complete_checkpoint(
    client: TestClient, project: ProjectKey, dataset: dict, pool: str, engine: Engine
) -> None:
    source = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    ids = _with_checkpoints(engine, source["id"], [10, 20])
    job = submit(client, project, _fine_tune(dataset["id"], pool, job=source["id"]))
    assert job["spec"]["model"]["init_from"] == {"job": source["id"], "checkpoint": ids[20]}
    # A newer checkpoint of the source does not move the pinned one.
    _with_checkpoints(engine, source["id"], [30])
    again = client.get(f"/v1/jobs/{job['id']}", headers=project.headers).json()
    assert again["spec"]["model"]["init_from"]["checkpoint"] == ids[20]


def test_init_from_a_checkpoint_id_fills_in_its_job(
    client: TestClient, project: ProjectKey, dataset: dict, pool: str, engine: Engine
) -> None:
    source = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    ids = _with_checkpoints(engine, source["id"], [10, 20])
    job = submit(client, project, _fine_tune(dataset["id"], pool, checkpoint=ids[10]))
    assert job["spec"]["model"]["init_from"] == {"job": source["id"], "checkpoint": ids[10]}


def test_another_projects_job_or_checkpoint_is_404_and_stores_nothing(
    client: TestClient,
    project: ProjectKey,
    other_project: ProjectKey,
    dataset: dict,
    pool: str,
    engine: Engine,
) -> None:
    theirs = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    ids = _with_checkpoints(engine, theirs["id"], [10])
    answer = client.post(
        "/v1/datasets", json={"name": "c", "uri": dataset["uri"]}, headers=other_project.headers
    )
    mine = answer.json()["id"]
    before = counts(engine, other_project.project_id)
    for source, field in (
        ({"job": theirs["id"]}, "job"),
        ({"checkpoint": ids[10]}, "checkpoint"),
    ):
        answer = client.post(
            "/v1/jobs", json=_fine_tune(mine, pool, **source), headers=other_project.headers
        )
        assert_error(answer, 404, "not_found", [*LOC, field])
    assert counts(engine, other_project.project_id) == before


def test_a_job_without_a_complete_checkpoint_is_409(
    client: TestClient, project: ProjectKey, dataset: dict, pool: str
) -> None:
    source = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    answer = client.post(
        "/v1/jobs", json=_fine_tune(dataset["id"], pool, job=source["id"]), headers=project.headers
    )
    assert_error(answer, 409, "conflict", [*LOC, "job"])


def test_a_checkpoint_of_another_job_or_a_model_of_other_shapes_is_422(
    client: TestClient, project: ProjectKey, dataset: dict, pool: str, engine: Engine
) -> None:
    first = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    second = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    ids = _with_checkpoints(engine, first["id"], [10])
    spec = _fine_tune(dataset["id"], pool, job=second["id"], checkpoint=ids[10])
    answer = client.post("/v1/jobs", json=spec, headers=project.headers)
    assert_error(answer, 422, "validation_error", [*LOC, "checkpoint"])

    wider = _fine_tune(dataset["id"], pool, job=first["id"])
    wider["model"]["d_model"] = 256
    answer = client.post("/v1/jobs", json=wider, headers=project.headers)
    error = assert_error(answer, 422, "validation_error", LOC)
    assert "d_model: 128 there, 256 here" in error["message"]
    # Dropout changes no shape: accepted.
    submit(client, project, {**wider, "model": {**wider["model"], "d_model": 128, "dropout": 0.1}})


def test_an_empty_init_from_is_422_with_its_path(
    client: TestClient, project: ProjectKey, dataset: dict, pool: str
) -> None:
    answer = client.post("/v1/jobs", json=_fine_tune(dataset["id"], pool), headers=project.headers)
    assert_error(answer, 422, "validation_error", LOC)


def test_a_replayed_fine_tune_returns_the_first_job_though_a_newer_checkpoint_exists(
    client: TestClient, project: ProjectKey, dataset: dict, pool: str, engine: Engine
) -> None:
    source = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    ids = _with_checkpoints(engine, source["id"], [10])
    spec = _fine_tune(dataset["id"], pool, job=source["id"])
    first = submit(client, project, spec, **{"Idempotency-Key": "ft-1"})
    _with_checkpoints(engine, source["id"], [20])
    again = client.post(
        "/v1/jobs", json=spec, headers={**project.headers, "Idempotency-Key": "ft-1"}
    )
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first["id"]
    assert again.json()["spec"]["model"]["init_from"]["checkpoint"] == ids[10]


def test_launch_passes_the_pinned_uri_and_a_deleted_one_fails_only_a_job_without_its_own(
    client: TestClient, project: ProjectKey, dataset: dict, pool: str, engine: Engine
) -> None:
    source = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    _with_checkpoints(engine, source["id"], [10])
    job = submit(client, project, _fine_tune(dataset["id"], pool, job=source["id"]))
    pinned = InitFromSpec.model_validate(job["spec"]["model"]["init_from"])

    def launch_uri() -> str | None:
        with Session(engine) as session:
            return init_from.launch_uri(
                session=session, job_id=job["id"], project_id=project.project_id, source=pinned
            )

    assert launch_uri() == f"/ckpt/jobs/{source['id']}/step_00000010"
    with Session(engine) as session:  # retention removed it
        upserts.checkpoint_deleted(session=session, job_id=source["id"], step=10)
        session.commit()
    with pytest.raises(InvalidInput, match="no longer exists"):
        launch_uri()
    _with_checkpoints(engine, job["id"], [5])  # a later attempt resumes from its own
    assert launch_uri() is None
