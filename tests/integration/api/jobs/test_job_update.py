"""`PATCH /v1/jobs/{id}`: labels (the whole set) and a free-text note, written after submit;
and the best losses a job carries for the jobs list (kept at ingest)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from core.jobs import upserts
from core.jobs.upserts import Metric
from core.platform.db import session_scope
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, job_spec, submit


def _patch(client: TestClient, project: ProjectKey, job_id: int, body: Any) -> Any:
    # json.dumps escapes lone surrogates (\\ud800), as a client in another language may send.
    return client.patch(
        f"/v1/jobs/{job_id}",
        content=json.dumps(body),
        headers={**project.headers, "Content-Type": "application/json"},
    )


def test_labels_are_replaced_and_the_note_is_kept_until_cleared(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str
) -> None:
    job = submit(client, project, job_spec(dataset["id"], labels={"team": "nlp", "old": "1"},
                                           resources={"pool": pool}))  # fmt: skip
    assert job["note"] is None
    answer = _patch(client, project, job["id"], {"labels": {"team": "vision"}, "note": "a\nb"})
    assert answer.status_code == 200, answer.text
    assert (answer.json()["labels"], answer.json()["note"]) == ({"team": "vision"}, "a\nb")
    # A field left out stays; the list's label filter sees the new set.
    assert _patch(client, project, job["id"], {"note": "kept?"}).json()["labels"] == {
        "team": "vision"
    }
    listed = client.get("/v1/jobs", params={"label": "team=vision"}, headers=project.headers)
    assert [j["id"] for j in listed.json()["items"]] == [job["id"]]
    assert listed.json()["items"][0]["note"] == "kept?"
    cleared = _patch(client, project, job["id"], {"labels": {}, "note": ""}).json()
    assert (cleared["labels"], cleared["note"]) == ({}, None)
    again = client.get(f"/v1/jobs/{job['id']}", headers=project.headers).json()
    assert (again["labels"], again["note"]) == ({}, None)
    assert again["spec"]["labels"] == {"team": "nlp", "old": "1"}  # as submitted


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"labels": {"": "x"}}, ["body", "labels", "", "[key]"]),
        ({"labels": {"k": "v" * 201}}, ["body", "labels", "k"]),
        ({"labels": {f"k{i}": "v" for i in range(65)}}, ["body", "labels"]),
        ({"labels": ["team=nlp"]}, ["body", "labels"]),
        ({"note": "x" * 10_001}, ["body", "note"]),
        ({"note": "nul\x00"}, ["body", "note"]),
        ({"note": "half \ud800"}, ["body", "note"]),
        ({"labels": {"k\ud800": "v"}}, None),
        ({"labels": {"k": "\udfff"}}, ["body", "labels", "k"]),
        ({"nope": 1}, ["body", "nope"]),
    ],
)
def test_bad_updates_are_422_with_the_field_path(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str,
    body: Any, loc: list[Any] | None,
) -> None:  # fmt: skip
    job = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    assert_error(_patch(client, project, job["id"], body), 422, "validation_error", loc)


def test_another_projects_job_is_404(
    client: TestClient, project: ProjectKey, other_project: ProjectKey,
    dataset: dict[str, Any], pool: str,
) -> None:  # fmt: skip
    job = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    assert_error(_patch(client, other_project, job["id"], {"note": "x"}), 404, "not_found")
    assert_error(_patch(client, project, 10**9, {"note": "x"}), 404, "not_found")


def test_best_losses_are_the_lowest_finite_values_reported(
    client: TestClient, engine: Engine, project: ProjectKey, dataset: dict[str, Any], pool: str
) -> None:
    job = submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))
    assert (job["best_loss"], job["best_eval_loss"]) == (None, None)
    batches = [
        [
            Metric("loss", 1, 3.0, 0.0),
            Metric("loss", 2, 2.5, 0.0),
            Metric("eval_loss", 2, 2.8, 0.0),
        ],
        [Metric("loss", 3, float("nan"), 0.0), Metric("loss", 4, 2.7, 0.0)],
        [Metric("eval_loss", 4, 2.9, 0.0), Metric("eval_loss", 5, float("-inf"), 0.0)],
    ]
    for points in batches:
        with session_scope(engine) as session:
            upserts.metrics(session=session, job_id=job["id"], attempt=1, points=points)
    got = client.get(f"/v1/jobs/{job['id']}", headers=project.headers).json()
    assert (got["best_loss"], got["best_eval_loss"]) == (2.5, 2.8)
    assert got["latest_metrics"]["loss"] == 2.7
    assert got["latest_metrics"]["eval_loss"] is None  # -inf: JSON has no such number
