"""Checkpoint exports end to end: asked for with `torchyard export` against a real API server,
made by a real Celery worker running `python -m trainer.exports.safetensors`, downloaded and read
back with safetensors. The finished job and its export also prove that no answer of the API
names the
server's own directories (docs/CONTRACTS.md, section 4)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from typer.testing import CliRunner, Result

from api.main import create_app
from core.jobs import upserts
from core.openai.projection import BASE_LABEL, JOB_PREFIX, model_name
from core.openai.results import RESULT_PREFIX
from core.platform.db import session_scope
from core.platform.settings import Settings
from core.platform.tables import Sweep, SweepTrial, WebhookEvent
from tests.conftest import ProjectKey, make_project
from tests.integration.api.code_archives import code_files, tar_gz, upload
from tests.integration.workers.helpers import (
    Worker,
    create_job,
    job_events,
    job_row,
    run_to_success,
    start_exporter,
    tiny_spec,
    wait_for,
)
from tests.support.sessions import run_and_sampler
from torchyard.cli import app as cli_app
from trainer.exports.safetensors import MODEL_PREFIX, load_model_weights


@pytest.fixture(scope="module")
def exporter(settings: Settings, celery_client: Celery, worker_logs: Path) -> Iterator[Worker]:
    w = start_exporter(settings=settings, client=celery_client, log_dir=worker_logs)
    yield w
    w.stop()


@pytest.fixture(scope="module")
def api(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), raise_server_exceptions=True) as client:
        yield client


def _wait_export(api: TestClient, path: str, project: ProjectKey, worker: Worker) -> Any:
    def done() -> Any:
        export = api.get(path, headers=project.headers).json()
        return export if export["state"] in ("ready", "failed") else None

    try:
        return wait_for(f"the export at {path}", done, 120, 0.2)
    except BaseException:
        print(worker.log[-6000:])
        raise


def _cli(base_url: str, api_key: str, tmp_path: Path) -> Callable[..., Result]:
    """`torchyard ...` against `base_url` with `api_key`."""
    env = {
        "TORCHYARD_URL": base_url,
        "TORCHYARD_API_KEY": api_key,
        "TORCHYARD_CONFIG": str(tmp_path / "no-config.toml"),
    }
    return lambda *args: CliRunner().invoke(cli_app, list(args), env=env)


def _model_shapes(checkpoint_uri: str) -> dict[str, tuple[int, ...]]:
    """The model weights a DCP checkpoint holds, name -> full shape, from its metadata."""
    metadata = FileSystemReader(checkpoint_uri).read_metadata().state_dict_metadata
    return {
        key.removeprefix(MODEL_PREFIX): tuple(item.size)
        for key, item in metadata.items()
        if key.startswith(MODEL_PREFIX) and isinstance(item, TensorStorageMetadata)
    }


@dataclass(frozen=True)
class Trained:
    """A finished job of a project of its own, trained on an upload (so its data, checkpoints
    and exports all lie in the server's storage), with complete checkpoints at steps 2 and 4
    (each test exports its own); the project has a code archive and a webhook subscription
    (so the run's webhook events were written)."""

    project: ProjectKey  # an admin key
    job_id: int
    dataset_id: str
    code_id: str
    webhook_id: str
    model_id: str  # the job as an OpenAI fine-tuned model
    checkpoints: dict[int, Any]  # by step, as the admin key lists them


@pytest.fixture(scope="module")
def trained(
    api: TestClient, engine: Engine, celery_client: Celery, corpus_dir: Path, worker: Worker
) -> Trained:
    project = make_project(engine)
    corpus = sorted(corpus_dir.glob("*.py"))[0]
    uploaded = api.post(
        "/v1/datasets/upload",
        files={"file": (corpus.name, corpus.read_bytes())},
        data={"name": "corpus"},
        headers=project.headers,
    )
    assert uploaded.status_code == 201, uploaded.text
    code = upload(api, project, tar_gz(code_files()))
    assert code.status_code == 201, code.text
    # A public address literal: nothing is sent (no delivery loop in tests), events are kept.
    hook = {"url": "https://93.184.216.34/hook", "event_types": ["*"]}
    webhook = api.post("/v1/webhooks", json=hook, headers=project.headers)
    assert webhook.status_code == 201, webhook.text
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=uploaded.json()["id"],
        train={"max_steps": 4},
        eval={"interval_steps": 4},
        checkpoint={"interval_steps": 2},
        labels={BASE_LABEL: "tiny"},  # shown by the OpenAI-compatible view too
    )
    job_id = run_to_success(engine, celery_client, project, spec, worker, 120).id
    listed = api.get(f"/v1/jobs/{job_id}/checkpoints", headers=project.headers).json()
    checkpoints = {c["step"]: c for c in listed["items"]}
    assert sorted(checkpoints) == [2, 4]
    return Trained(
        project,
        job_id,
        uploaded.json()["id"],
        code.json()["id"],
        webhook.json()["id"],
        model_name(job_row(engine, job_id)),
        checkpoints,
    )


def test_torchyard_export_asks_waits_and_downloads_the_checkpoints_model_tensors(
    api: TestClient,
    live_api: str,
    engine: Engine,
    other_project: ProjectKey,
    trained: Trained,
    exporter: Worker,
    tmp_path: Path,
) -> None:
    project, job_id, checkpoint = trained.project, trained.job_id, trained.checkpoints[4]
    assert checkpoint["export"] is None
    path = f"/v1/jobs/{job_id}/checkpoints/{checkpoint['id']}/export"
    assert api.post(path, headers=other_project.headers).status_code == 404

    # The CLI asks for the export (a real HTTP server), waits for the worker, downloads it.
    out = tmp_path / "model.safetensors"
    cli = _cli(live_api, project.api_key, tmp_path)
    done = cli("export", str(job_id), str(checkpoint["id"]), "--out", str(out), "--timeout", "120")
    assert done.exit_code == 0, done.output + exporter.log[-6000:]
    export = api.get(path, headers=project.headers).json()
    assert export["state"] == "ready" and export["error"] is None
    body = out.read_bytes()
    assert len(body) == export["size_bytes"]
    assert hashlib.sha256(body).hexdigest() == export["sha256"]
    assert f"{out} ({export['size_bytes']} bytes, sha256 {export['sha256']})" in done.stdout

    tensors = safetensors.torch.load(body)
    # The admin key sees where the checkpoint lies on the server (`uri` is storage-relative).
    server_uri = checkpoint["server_uri"]
    assert server_uri.endswith(f"/{checkpoint['uri']}")
    assert {n: tuple(t.shape) for n, t in tensors.items()} == _model_shapes(server_uri)
    weights = load_model_weights(server_uri)
    assert weights
    assert all(torch.equal(tensors[name], weights[name]) for name in weights)

    download = api.get(f"{path}/download", headers=project.headers)
    assert download.status_code == 200 and download.content == body
    assert int(download.headers["content-length"]) == len(body)
    assert download.headers["etag"] == f'"{export["sha256"]}"'
    assert download.headers["content-disposition"] == (
        f'attachment; filename="job{job_id}-step00000004.safetensors"'
    )
    for method, url in (("post", path), ("get", path), ("get", f"{path}/download")):
        assert api.request(method, url, headers=other_project.headers).status_code == 404

    again = api.post(path, headers=project.headers)
    assert again.status_code == 200 and again.json() == export
    listed = api.get(f"/v1/jobs/{job_id}/checkpoints", headers=project.headers).json()
    assert [c["export"] for c in listed["items"] if c["step"] == 4] == [export]
    shown = cli("checkpoints", str(job_id))
    assert shown.exit_code == 0 and "ready" in shown.stdout, shown.output
    events = [e.message for e in job_events(engine, job_id) if e.kind == "info"]
    assert f"export of checkpoint at step 4 ready ({export['size_bytes']} bytes)" in events


# GET routes that serve a file's bytes (weights, an uploaded file), not text about it.
_BYTES = ("/export/download", "/content", "/files/{name}")
_QUERY: dict[str, dict[str, int]] = {  # whole histories, not a first page
    "/v1/jobs/{job_id}/events": {"limit": 1000},
    "/v1/jobs/{job_id}/logs": {"limit": 5000},
    "/openai/v1/fine_tuning/jobs/{job_id}/events": {"limit": 100},
}


def _server_dirs(settings: Settings) -> set[str]:
    return {settings.storage_url, str(settings.home), str(settings.home.resolve())}


def _fill(
    path: str,
    trained: Trained,
    checkpoint_id: int,
    sweep_id: int = 0,
    tinker: tuple[str, str, str] = ("", "", ""),
) -> str:
    """`path` with its parameters filled with `trained`'s resources; fails on one it cannot."""
    job = f"{JOB_PREFIX}{trained.job_id}" if path.startswith("/openai/") else str(trained.job_id)
    values = {
        "job_id": job,
        "checkpoint_id": str(checkpoint_id),
        "dataset_id": trained.dataset_id,
        "file_id": f"{RESULT_PREFIX}{trained.job_id}",  # the fine-tune's result file
        "code_id": trained.code_id,
        "webhook_id": trained.webhook_id,
        "model_id": trained.model_id,
        "sweep_id": str(sweep_id),
        # a training session of the project (Tinker's API), a training client, a sampler
        "session_id": tinker[0],
        "training_run_id": tinker[1],
        "sampler_id": tinker[2],
    }
    for name in re.findall(r"{(\w+)}", path):
        if name not in values:
            pytest.fail(f"GET {path}: no value for {{{name}}}; add one to _fill")
        path = path.replace(f"{{{name}}}", values[name])
    return path


def _sweep_naming_a_path(
    api: TestClient, engine: Engine, settings: Settings, trained: Trained
) -> int:
    """A sweep of the project whose one trial (the trained job) and the sweep itself ended with
    an error naming a file of the server, as a failed job's error can."""
    spec = {
        "name": "paths",
        "base": {"name": "t", "data": {"dataset": trained.dataset_id}, "train": {"max_steps": 10}},
        "space": {"optim.lr": {"choice": [1e-3, 1e-2]}},
    }
    answer = api.post("/v1/sweeps", json=spec, headers=trained.project.headers)
    assert answer.status_code == 201, answer.text
    sweep_id = int(answer.json()["id"])
    error = f"cannot read {settings.storage_path}/jobs/{trained.job_id}/x"
    with session_scope(engine) as s:
        s.add(
            SweepTrial(
                sweep_id=sweep_id,
                number=0,
                optuna_trial_id=0,
                job_id=trained.job_id,
                state="failed",
                params={"optim.lr": 1e-3},
                error=error,
            )
        )
        row = s.get(Sweep, sweep_id)
        assert row is not None
        row.state, row.error = "failed", error
    return sweep_id


def _without_server_uri(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_server_uri(v) for k, v in value.items() if k != "server_uri"}
    if isinstance(value, list):
        return [_without_server_uri(v) for v in value]
    return value


def test_no_answer_about_a_finished_job_names_the_servers_directories_and_admins_see_server_uri(
    api: TestClient,
    engine: Engine,
    settings: Settings,
    trained: Trained,
    exporter: Worker,
) -> None:
    owner, checkpoint = trained.project, trained.checkpoints[2]
    export_path = f"/v1/jobs/{trained.job_id}/checkpoints/{checkpoint['id']}/export"
    assert api.post(export_path, headers=owner.headers).status_code == 202
    assert _wait_export(api, export_path, owner, exporter)["state"] == "ready"
    member = api.post(
        "/v1/members", json={"subject": "viewer@x.org", "role": "viewer"}, headers=owner.headers
    ).json()
    viewer = api.post(
        "/v1/keys", json={"name": "viewer", "member_id": member["id"]}, headers=owner.headers
    ).json()["secret"]
    dirs = _server_dirs(settings)
    sweep_id = _sweep_naming_a_path(api, engine, settings, trained)
    session = api.post(
        "/tinker/api/v1/create_session",
        json={"type": "create_session", "tags": [], "sdk_version": "0.38.0"},
        headers=owner.headers,
    )
    assert session.status_code == 200, session.text
    session_id = session.json()["session_id"]
    run_id, sampler_id = run_and_sampler(engine, owner.project_id, session_id, trained.job_id)
    routes = [
        path
        for path, item in api.get("/openapi.json").json()["paths"].items()
        if "get" in item and not path.endswith(_BYTES)
    ]
    read_by_viewer = set()
    for route in routes:
        url = _fill(route, trained, checkpoint["id"], sweep_id, (session_id, run_id, sampler_id))
        for key in (viewer, owner.api_key):
            answer = api.get(url, params=_QUERY.get(route), headers=_bearer(key))
            assert answer.status_code in (200, 403), (url, answer.text)
            text = answer.text
            if key == owner.api_key and answer.headers["content-type"] == "application/json":
                text = json.dumps(_without_server_uri(answer.json()))
            assert [d for d in dirs if d in text] == [], (url, text)
            if key == viewer and answer.status_code == 200:
                read_by_viewer.add(route)
    # The viewer read everything of the job, its data and files (only admin routes refused it).
    assert {r for r in routes if "_id}" in r and "webhook" not in r} <= read_by_viewer

    listed = api.get(f"/v1/jobs/{trained.job_id}/checkpoints", headers=owner.headers).json()
    for shown in listed["items"]:
        assert shown["uri"] == f"jobs/{trained.job_id}/checkpoints/step_{shown['step']:08d}"
        assert shown["server_uri"] == f"{settings.storage_url}/{shown['uri']}"
    export = next(c["export"] for c in listed["items"] if c["step"] == 2)
    assert export["uri"] == f"jobs/{trained.job_id}/exports/step_00000002"
    assert export["server_uri"] == f"{settings.storage_url}/{export['uri']}"
    as_viewer = api.get(f"/v1/jobs/{trained.job_id}/checkpoints", headers=_bearer(viewer)).json()
    assert [c["uri"] for c in as_viewer["items"]] == [c["uri"] for c in listed["items"]]
    assert {c["server_uri"] for c in as_viewer["items"]} == {None}
    dataset = api.get(f"/v1/datasets/{trained.dataset_id}", headers=owner.headers).json()
    assert dataset["server_uri"] == f"{settings.storage_url}/{dataset['uri']}"

    # Nor do the webhook events the run wrote (job states, checkpoints, the export).
    with session_scope(engine) as s:
        sent = s.scalars(
            select(WebhookEvent).where(WebhookEvent.project_id == owner.project_id)
        ).all()
        payloads = [(e.type, json.dumps(e.payload)) for e in sent]
    assert {"job.succeeded", "checkpoint.saved", "export.ready"} <= {t for t, _ in payloads}
    assert [(t, p) for t, p in payloads if any(d in p for d in dirs)] == []


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_an_export_needs_no_worker_of_the_jobs_pool_and_reports_the_exporters_error(
    api: TestClient,
    engine: Engine,
    project: ProjectKey,
    dataset_id: str,
    exporter: Worker,
    tmp_path: Path,
) -> None:
    """The job's pool has no worker at all (as when its GPUs are all busy training): the export
    still runs, on the exporter. Its checkpoint is unreadable, so it fails with the exporter's
    error. The job, which never runs, is cancelled at the end."""
    pool = f"no-workers-{tmp_path.name}"
    job_id = create_job(engine, project, tiny_spec(pool=pool, dataset_id=dataset_id))
    try:
        _export_an_unreadable_checkpoint(api, engine, project, exporter, job_id, tmp_path)
    finally:
        cancelled = api.post(f"/v1/jobs/{job_id}/cancel", headers=project.headers)
        assert cancelled.status_code == 202, cancelled.text


def _export_an_unreadable_checkpoint(
    api: TestClient,
    engine: Engine,
    project: ProjectKey,
    worker: Worker,
    job_id: int,
    tmp_path: Path,
) -> None:
    step_dir = tmp_path / "step_00000002"
    step_dir.mkdir()
    (step_dir / ".metadata").write_bytes(b"not a DCP metadata file")
    with session_scope(engine) as s:
        upserts.checkpoint(
            session=s, job_id=job_id, attempt=1, step=2, uri=str(step_dir), size_bytes=1
        )
    (checkpoint,) = api.get(f"/v1/jobs/{job_id}/checkpoints", headers=project.headers).json()[
        "items"
    ]
    path = f"/v1/jobs/{job_id}/checkpoints/{checkpoint['id']}/export"

    asked = api.post(path, headers=project.headers)
    assert asked.status_code == 202 and asked.json()["queue_position"] >= 1
    export = _wait_export(api, path, project, worker)
    assert export["queue_position"] is None

    assert export["state"] == "failed"
    assert export["error"].startswith("exporter exited with ")
    assert export["size_bytes"] is None and export["sha256"] is None
    download = api.get(f"{path}/download", headers=project.headers)
    assert download.status_code == 409
    assert "failed" in download.json()["error"]["message"]
