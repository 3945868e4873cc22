"""`entrypoint.inputs` at submission (`core.jobs.inputs`, real Postgres): each input is pinned
(a dataset to its id and sha256, a job to its latest complete checkpoint, a base model to its
registered location) and every problem comes back in one answer at its own path; another
project's dataset or job is 404 like one that does not exist."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from api.main import create_app
from core.jobs import upserts
from core.platform.settings import BaseModelEntry, Settings
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, counts, submit
from tests.integration.script_jobs import insert_archive
from tests.integration.workers.helpers import unique_queue

LOC = ["body", "entrypoint", "inputs"]
BASE = "tiny-llama"


@pytest.fixture(scope="module")
def registry_client(settings: Settings, models_root: Path) -> Iterator[TestClient]:
    """The API with a base-model registry of one model (a directory under a data root)."""
    model_dir = models_root / "inputs-base"
    model_dir.mkdir(exist_ok=True)
    with_registry = settings.model_copy(
        update={"base_models": {BASE: BaseModelEntry(path=str(model_dir))}}
    )
    with TestClient(create_app(with_registry), raise_server_exceptions=True) as client:
        yield client


def _spec(code: str, inputs: dict[str, Any], pool: str | None = None) -> dict[str, Any]:
    return {
        "name": "reads-inputs",
        "resources": {"procs_per_node": 1, "pool": pool or unique_queue("inputs")},
        "entrypoint": {"code": code, "command": ["python", "train.py"], "inputs": inputs},
    }


def _checkpointed_job(engine: Engine, client: TestClient, project: ProjectKey, code: str) -> int:
    """A script job of `project` with complete checkpoints at steps 10 and 20."""
    job = submit(client, project, _spec(code, {}))
    with Session(engine) as session:
        for step in (10, 20):
            upserts.checkpoint(
                session=session,
                job_id=job["id"],
                attempt=1,
                step=step,
                uri=f"/ckpt/jobs/{job['id']}/step_{step:08d}",
                size_bytes=1,
            )
        session.commit()
    checkpoints = client.get(f"/v1/jobs/{job['id']}/checkpoints", headers=project.headers).json()
    assert [c["step"] for c in checkpoints["items"]] == [10, 20]
    return int(job["id"])


def test_each_input_is_pinned_to_what_it_named_at_submission(
    registry_client: TestClient,
    engine: Engine,
    project: ProjectKey,
    corpus_dir: Path,
    models_root: Path,
) -> None:
    client = registry_client
    code = insert_archive(engine, project.project_id)
    dataset = client.post(
        "/v1/datasets", json={"name": "corpus", "uri": str(corpus_dir)}, headers=project.headers
    ).json()
    source = _checkpointed_job(engine, client, project, code)
    latest = client.get(f"/v1/jobs/{source}/checkpoints", headers=project.headers).json()
    job = submit(
        client,
        project,
        _spec(
            code,
            {
                "corpus": {"dataset": "corpus"},
                "model": {"base_model": BASE, "uri": "/etc"},  # a given location is replaced
                "start": {"job": source},
                "raw": {"path": str(corpus_dir)},
            },
        ),
    )
    assert job["spec"]["entrypoint"]["inputs"] == {
        "corpus": {"dataset": dataset["id"], "sha256": dataset["sha256"]},
        "model": {"base_model": BASE, "uri": str(models_root / "inputs-base")},
        "start": {"job": source, "checkpoint": latest["items"][-1]["id"]},
        "raw": {"path": str(corpus_dir)},
    }


def test_every_problem_of_the_inputs_comes_back_at_once_and_nothing_is_stored(
    registry_client: TestClient,
    engine: Engine,
    project: ProjectKey,
    other_project: ProjectKey,
    corpus_dir: Path,
    tmp_path: Path,
) -> None:
    client = registry_client
    code = insert_archive(engine, project.project_id)
    theirs_code = insert_archive(engine, other_project.project_id)
    their_dataset = client.post(
        "/v1/datasets",
        json={"name": "theirs", "uri": str(corpus_dir)},
        headers=other_project.headers,
    ).json()
    their_job = _checkpointed_job(engine, client, other_project, theirs_code)
    no_checkpoint = submit(client, project, _spec(code, {}))["id"]
    mine = _checkpointed_job(engine, client, project, code)
    before = counts(engine, project.project_id)
    answer = client.post(
        "/v1/jobs",
        json=_spec(
            code,
            {
                "unknown": {"dataset": "no-such-dataset"},
                "theirs": {"dataset": their_dataset["id"]},
                "their_job": {"job": their_job},
                "early": {"job": no_checkpoint},
                "wrong_job": {
                    "job": no_checkpoint,
                    "checkpoint": _latest_id(client, project, mine),
                },
                "outside": {"path": str(tmp_path)},
                "model": {"base_model": "no-such-model"},
            },
        ),
        headers=project.headers,
    )
    error = assert_error(answer, 422, "validation_error")
    found = {tuple(d["loc"][3:]): d["type"] for d in error["details"]}
    assert found == {
        ("unknown", "dataset"): "not_found",
        ("theirs", "dataset"): "not_found",
        ("their_job", "job"): "not_found",
        ("early", "job"): "conflict",
        ("wrong_job", "checkpoint"): "mismatch",
        ("outside", "path"): "forbidden",
        ("model", "base_model"): "not_found",
    }
    # Another project's resources read exactly as ones that do not exist (no oracle).
    messages = {tuple(d["loc"][3:]): d["msg"] for d in error["details"]}
    assert messages[("theirs", "dataset")] == f"no dataset {their_dataset['id']!r} in this project"
    assert messages[("their_job", "job")] == f"no job {their_job} in this project"
    assert counts(engine, project.project_id) == before


def _latest_id(client: TestClient, project: ProjectKey, job_id: int) -> int:
    items = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=project.headers).json()["items"]
    return int(items[-1]["id"])


@pytest.mark.parametrize(
    ("inputs", "status", "code", "field"),
    [
        ({"corpus": {"dataset": "no-such-dataset"}}, 404, "not_found", "dataset"),
        ({"corpus": {"path": "/etc"}}, 403, "forbidden", "path"),
    ],
)
def test_one_problem_answers_with_its_own_status(
    registry_client: TestClient,
    engine: Engine,
    project: ProjectKey,
    inputs: dict[str, Any],
    status: int,
    code: str,
    field: str,
) -> None:
    archive = insert_archive(engine, project.project_id)
    answer = registry_client.post("/v1/jobs", json=_spec(archive, inputs), headers=project.headers)
    assert_error(answer, status, code, [*LOC, "corpus", field])


def test_a_job_without_a_complete_checkpoint_is_a_conflict(
    registry_client: TestClient, engine: Engine, project: ProjectKey
) -> None:
    code = insert_archive(engine, project.project_id)
    early = submit(registry_client, project, _spec(code, {}))["id"]
    answer = registry_client.post(
        "/v1/jobs", json=_spec(code, {"start": {"job": early}}), headers=project.headers
    )
    assert_error(answer, 409, "conflict", [*LOC, "start", "job"])


def test_a_missing_code_archive_and_a_bad_input_are_told_together(
    registry_client: TestClient, engine: Engine, project: ProjectKey
) -> None:
    spec = _spec("code_0000000000000000", {"corpus": {"dataset": "no-such-dataset"}})
    answer = registry_client.post("/v1/jobs", json=spec, headers=project.headers)
    error = assert_error(answer, 422, "validation_error")
    assert [d["loc"] for d in error["details"]] == [
        ["body", "entrypoint", "code"],
        [*LOC, "corpus", "dataset"],
    ]


def test_the_spec_check_names_an_input_given_twice_by_its_line(
    registry_client: TestClient, project: ProjectKey
) -> None:
    text = (
        "name: twice\n"
        "entrypoint:\n"
        "  code: code_0000000000000000\n"
        "  command: [python, train.py]\n"
        "  inputs:\n"
        "    corpus: {dataset: a}\n"
        "    corpus: {dataset: b}\n"
    )
    answer = registry_client.post(
        "/v1/spec/validate",
        content=text,
        headers={**project.headers, "Content-Type": "application/yaml"},
    )
    assert answer.status_code == 422, answer.text
    (detail,) = answer.json()["error"]["details"]
    assert detail["line"] == 7 and "given twice" in detail["msg"], detail


def test_a_sweeps_base_pins_its_inputs_and_a_bad_one_is_refused_under_base(
    registry_client: TestClient, engine: Engine, project: ProjectKey, corpus_dir: Path
) -> None:
    """`entrypoint.inputs` belong to the sweep's base spec: pinned there once, so every trial
    reads the same data; the space searches the program's own `params`."""
    client = registry_client
    code = insert_archive(engine, project.project_id)
    dataset = client.post(
        "/v1/datasets", json={"name": "swept", "uri": str(corpus_dir)}, headers=project.headers
    ).json()
    base = _spec(code, {"corpus": {"dataset": "swept"}})
    base["entrypoint"]["params"] = {"lr": 0.001}
    sweep = {
        "name": "lr-with-inputs",
        "base": base,
        "space": {"entrypoint.params.lr": {"log_uniform": [1e-4, 1e-2]}},
        "searcher": "random",
        "max_trials": 2,
    }
    answer = client.post("/v1/sweeps", json=sweep, headers=project.headers)
    assert answer.status_code == 201, answer.text
    stored = answer.json()["spec"]["base"]["entrypoint"]["inputs"]
    assert stored == {"corpus": {"dataset": dataset["id"], "sha256": dataset["sha256"]}}

    sweep["base"] = _spec(code, {"corpus": {"dataset": "no-such-dataset"}})
    sweep["base"]["entrypoint"]["params"] = {"lr": 0.001}
    refused = client.post("/v1/sweeps", json=sweep, headers=project.headers)
    assert_error(refused, 404, "not_found", ["body", "base", *LOC[1:], "corpus", "dataset"])


def test_a_starting_job_fetching_an_input_says_so_until_its_inputs_are_placed(
    registry_client: TestClient, engine: Engine, project: ProjectKey
) -> None:
    """The worker's progress report of a fetch (`workers.inputs`) is the starting job's
    `waiting_for` and an event; once the inputs are placed the job waits for nothing."""
    from core.jobs import service as job_service
    from workers import inputs as worker_inputs

    code = insert_archive(engine, project.project_id)
    job_id = submit(registry_client, project, _spec(code, {}))["id"]
    with Session(engine) as session:
        claimed = job_service.claim(session=session, job_id=job_id, worker="w-inputs")
        assert claimed is not None
        session.commit()
        session.refresh(claimed)
        session.expunge(claimed)

    def factory() -> Session:
        return Session(engine)

    said = ["fetching input corpus: 0.4 GB of 1.2 GB", "fetching input corpus: 0.8 GB of 1.2 GB"]
    report = worker_inputs._reporter(factory, claimed, "w-inputs")
    for message, done in zip(said, (1, 2), strict=True):
        report(message, {"input": "corpus", "cache": "fetching", "bytes": done, "total_bytes": 3})
    shown = registry_client.get(f"/v1/jobs/{job_id}", headers=project.headers).json()
    assert (shown["state"], shown["waiting_for"]) == ("starting", said[1])
    events = registry_client.get(f"/v1/jobs/{job_id}/events", headers=project.headers).json()
    fetching = [e["message"] for e in events["items"] if e["data"].get("cache") == "fetching"]
    assert fetching == said[:1], "one progress event per input every 30 s, the reason each time"
    worker_inputs._clear_wait_reason(factory, claimed)
    shown = registry_client.get(f"/v1/jobs/{job_id}", headers=project.headers).json()
    assert shown["waiting_for"] is None
