"""Checkpoint exports end to end: asked for with `torchyard export` against a real API server,
made by a real Celery worker running `python -m trainer.export`, downloaded and read back with
safetensors."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from typer.testing import CliRunner, Result

from api.main import create_app
from core import ingest
from core.db import session_scope
from core.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    Worker,
    create_job,
    job_events,
    run_to_success,
    start_exporter,
    tiny_spec,
    wait_for,
)
from torchyard.cli import app as cli_app
from trainer.export import MODEL_PREFIX, load_model_weights


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


def test_torchyard_export_asks_waits_and_downloads_the_checkpoints_model_tensors(
    api: TestClient,
    live_api: str,
    engine: Engine,
    celery_client: Celery,
    project: ProjectKey,
    other_project: ProjectKey,
    dataset_id: str,
    worker: Worker,
    exporter: Worker,
    tmp_path: Path,
) -> None:
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        train={"max_steps": 4},
        eval={"interval_steps": 4},
        checkpoint={"interval_steps": 4},
    )
    job_id = run_to_success(engine, celery_client, project, spec, worker, 120).id
    listed = api.get(f"/v1/jobs/{job_id}/checkpoints", headers=project.headers).json()
    (checkpoint,) = listed["items"]
    assert checkpoint["step"] == 4 and checkpoint["export"] is None
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
    assert {n: tuple(t.shape) for n, t in tensors.items()} == _model_shapes(checkpoint["uri"])
    weights = load_model_weights(checkpoint["uri"])
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
    assert listed["items"][0]["export"] == export
    shown = cli("checkpoints", str(job_id))
    assert shown.exit_code == 0 and "ready" in shown.stdout, shown.output
    events = [e.message for e in job_events(engine, job_id) if e.kind == "info"]
    assert f"export of checkpoint at step 4 ready ({export['size_bytes']} bytes)" in events


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
        ingest.checkpoint(
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
