"""Asking for a checkpoint's safetensors export over the API: queued once, project-scoped, 404
for what is not the caller's, 409 for a checkpoint whose files are gone or an export not ready.

No worker consumes the test's pool here, so exports stay `pending`; the worker side (a real
export, downloaded and read back) is tests/integration/workers/test_export.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, delete, select, update

from api.main import create_app
from core.jobs import upserts
from core.jobs.exports import NO_EXPORTER
from core.platform.db import session_scope
from core.platform.queue import EXPORT_CHECKPOINT_TASK
from core.platform.settings import Settings
from core.platform.tables import Checkpoint, CheckpointExport, utcnow
from core.platform.tables import Worker as WorkerRow
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, job_spec, queued_messages, submit
from tests.integration.conftest import cli_invoker


def _checkpoint(engine: Engine, job_id: int, step: int, root: Path, complete: bool = True) -> int:
    """Record a checkpoint of `job_id` at `step` whose directory (under `root`) holds a DCP
    `.metadata` file when `complete`; returns its id."""
    step_dir = root / f"job{job_id}" / f"step_{step:08d}"
    step_dir.mkdir(parents=True)
    if complete:
        (step_dir / ".metadata").write_bytes(b"not read by the API")
    with session_scope(engine) as s:
        upserts.checkpoint(
            session=s, job_id=job_id, attempt=1, step=step, uri=str(step_dir), size_bytes=10
        )
    with session_scope(engine) as s:
        return s.scalars(
            select(Checkpoint.id).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
        ).one()


def _path(job_id: int, checkpoint_id: int | str) -> str:
    return f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/export"


def _job(client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str) -> int:
    return int(submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))["id"])


@dataclass(frozen=True)
class Exportable:
    job_id: int
    checkpoint_id: int  # a complete checkpoint of the job, at step 10
    path: str  # its export's


@pytest.fixture
def exportable(
    client: TestClient,
    engine: Engine,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
    tmp_path: Path,
) -> Exportable:
    """A job of `project` in `pool` with a complete checkpoint at step 10."""
    job_id = _job(client, project, dataset, pool)
    checkpoint_id = _checkpoint(engine, job_id, 10, tmp_path)
    return Exportable(job_id, checkpoint_id, _path(job_id, checkpoint_id))


def test_an_export_is_queued_once_to_the_export_queue_and_asking_again_returns_it(
    client: TestClient,
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    pool: str,
    exportable: Exportable,
) -> None:
    job_id, checkpoint_id = exportable.job_id, exportable.checkpoint_id

    first = client.post(_path(job_id, checkpoint_id), headers=project.headers)
    assert first.status_code == 202, first.text
    export = first.json()
    assert export["state"] == "pending" and export["queue_position"] >= 1
    assert (export["job_id"], export["checkpoint_id"], export["step"]) == (
        job_id,
        checkpoint_id,
        10,
    )
    # In storage, named relative to it; the full location for the admin key only.
    assert export["uri"] == f"jobs/{job_id}/exports/step_00000010"
    assert export["server_uri"] == f"{settings.storage_url}/{export['uri']}"
    assert export["size_bytes"] is None and export["sha256"] is None

    again = client.post(_path(job_id, checkpoint_id), headers=project.headers)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == export["id"]
    with session_scope(engine) as s:
        rows = s.scalars(
            select(CheckpointExport.id).where(CheckpointExport.checkpoint_id == checkpoint_id)
        ).all()
    assert rows == [export["id"]]
    # The export message goes to the export queue, never the job's pool (where it would wait
    # behind training); a pending export is sent again when asked again (the exporter's claim
    # makes the duplicate harmless).
    assert queued_messages(settings.broker_url, pool) == [("workers.run_job", job_id)]
    exports_sent = queued_messages(settings.broker_url, settings.export_queue)
    assert [m for m in exports_sent if m[1] == export["id"]] == [
        (EXPORT_CHECKPOINT_TASK, export["id"])
    ] * 2

    status = client.get(_path(job_id, checkpoint_id), headers=project.headers)
    assert status.status_code == 200 and status.json() == export
    listed_export = {**export, "queue_position": None}  # a list leaves positions out
    listed = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=project.headers).json()
    assert [c["export"] for c in listed["items"]] == [listed_export]
    download = client.get(f"{_path(job_id, checkpoint_id)}/download", headers=project.headers)
    assert_error(download, 409, "conflict")
    assert "pending" in download.json()["error"]["message"]


def test_another_projects_key_gets_404_for_the_export_and_stores_nothing(
    client: TestClient,
    engine: Engine,
    project: ProjectKey,
    other_project: ProjectKey,
    exportable: Exportable,
) -> None:
    job_id, path = exportable.job_id, exportable.path

    assert_error(client.post(path, headers=other_project.headers), 404, "not_found")
    with session_scope(engine) as s:
        assert s.scalar(select(CheckpointExport).where(CheckpointExport.job_id == job_id)) is None
    assert client.post(path, headers=project.headers).status_code == 202
    assert_error(client.get(path, headers=other_project.headers), 404, "not_found")
    assert_error(client.get(f"{path}/download", headers=other_project.headers), 404, "not_found")
    listed = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=other_project.headers)
    assert_error(listed, 404, "not_found")


def test_unknown_malformed_or_other_jobs_checkpoint_ids_are_404_or_422(
    client: TestClient,
    engine: Engine,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
    tmp_path: Path,
) -> None:
    job_id = _job(client, project, dataset, pool)
    other_job = _job(client, project, dataset, pool)
    others_checkpoint = _checkpoint(engine, other_job, 10, tmp_path)

    headers = project.headers
    assert_error(client.post(_path(job_id, others_checkpoint), headers=headers), 404, "not_found")
    assert_error(client.post(_path(job_id, 2**62), headers=headers), 404, "not_found")
    assert_error(client.get(_path(job_id, 2**62), headers=headers), 404, "not_found")
    for bad in ("abc", 0, 2**63):
        answer = client.post(_path(job_id, bad), headers=headers)
        assert_error(answer, 422, "validation_error", loc=["path", "checkpoint_id"])
    assert_error(client.post(_path(2**62, others_checkpoint), headers=headers), 404, "not_found")


def test_a_checkpoint_whose_files_are_gone_is_409(
    client: TestClient,
    engine: Engine,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
    tmp_path: Path,
) -> None:
    job_id = _job(client, project, dataset, pool)
    checkpoint_id = _checkpoint(engine, job_id, 10, tmp_path, complete=False)
    answer = client.post(_path(job_id, checkpoint_id), headers=project.headers)
    assert_error(answer, 409, "conflict")
    assert "retention" in answer.json()["error"]["message"]


def test_a_failed_export_is_queued_again_unless_retention_deleted_its_checkpoint(
    client: TestClient, engine: Engine, project: ProjectKey, exportable: Exportable
) -> None:
    checkpoint_id, path = exportable.checkpoint_id, exportable.path
    export_id = client.post(path, headers=project.headers).json()["id"]

    def fail_it() -> None:
        with session_scope(engine) as s:
            s.execute(
                update(CheckpointExport)
                .where(CheckpointExport.id == export_id)
                .values(state="failed", error="exporter exited with 1: boom")
            )

    fail_it()
    assert client.get(path, headers=project.headers).json()["error"].endswith("boom")
    assert_error(client.get(f"{path}/download", headers=project.headers), 409, "conflict")
    again = client.post(path, headers=project.headers)
    assert again.status_code == 202, again.text
    assert again.json()["id"] == export_id
    assert again.json()["state"] == "pending" and again.json()["error"] is None

    fail_it()
    with session_scope(engine) as s:  # as the worker does on a `checkpoint_deleted` event
        s.execute(delete(Checkpoint).where(Checkpoint.id == checkpoint_id))
    answer = client.post(path, headers=project.headers)
    assert_error(answer, 409, "conflict")
    assert "deleted by retention" in answer.json()["error"]["message"]
    assert client.get(path, headers=project.headers).json()["state"] == "failed"


def test_a_lora_jobs_checkpoint_is_409_naming_the_adapter_export_instead(
    client: TestClient,
    engine: Engine,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
    tmp_path: Path,
) -> None:
    source = int(submit(client, project, job_spec(dataset["id"], resources={"pool": pool}))["id"])
    _checkpoint(engine, source, 20, tmp_path / "source")  # the weights LoRA adapts
    spec = job_spec(
        dataset["id"], resources={"pool": pool}, model={"init_from": {"job": source}}, lora={"r": 4}
    )
    job_id = int(submit(client, project, spec)["id"])
    checkpoint_id = _checkpoint(engine, job_id, 10, tmp_path)
    answer = client.post(_path(job_id, checkpoint_id), headers=project.headers)
    message = assert_error(answer, 409, "conflict")["message"]
    assert f"GET /v1/jobs/{job_id}/lora" in message  # where its adapter and merged model are
    with session_scope(engine) as s:
        stored = s.scalars(select(CheckpointExport).where(CheckpointExport.job_id == job_id))
        assert stored.all() == []


def test_a_pending_export_says_when_no_exporter_serves_the_export_queue(
    settings: Settings,
    engine: Engine,
    project: ProjectKey,
    corpus_dir: Path,
    pool: str,
    tmp_path: Path,
) -> None:
    """Its answer and the job's checkpoints list say `no exporter is running` until a live
    exporter (a fresh `workers` row on the export queue, not stopping) is there, and again once
    it is stopping or silent for longer than `worker_timeout_s`."""
    queue = f"exports-{pool}"  # an export queue of this test's own: no exporter of another test
    own = settings.model_copy(update={"export_queue": queue})
    with TestClient(create_app(own), raise_server_exceptions=True) as client:
        registered = client.post(
            "/v1/datasets", json={"name": "corpus", "uri": str(corpus_dir)}, headers=project.headers
        )
        job_id = _job(client, project, registered.json(), pool)
        checkpoint_id = _checkpoint(engine, job_id, 10, tmp_path)
        path = _path(job_id, checkpoint_id)

        def waiting_for() -> tuple[Any, Any]:
            export = client.get(path, headers=project.headers).json()
            listed = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=project.headers)
            (item,) = listed.json()["items"]
            return export["waiting_for"], item["export"]["waiting_for"]

        asked = client.post(path, headers=project.headers)
        assert asked.status_code == 202, asked.text
        assert asked.json()["waiting_for"] == NO_EXPORTER
        assert waiting_for() == (NO_EXPORTER, NO_EXPORTER)

        now = utcnow()
        name = f"exporter-{pool}@tests"
        with session_scope(engine) as s:
            s.add(WorkerRow(name=name, pool=f"other,{queue}", host="h", pid=1, started_at=now,
                            heartbeat_at=now))  # fmt: skip
        assert waiting_for() == (None, None)
        with session_scope(engine) as s:
            s.execute(update(WorkerRow).where(WorkerRow.name == name).values(stopping=True))
        assert waiting_for() == (NO_EXPORTER, NO_EXPORTER)
        silent = now - timedelta(seconds=settings.worker_timeout_s + 1)
        with session_scope(engine) as s:
            s.execute(
                update(WorkerRow)
                .where(WorkerRow.name == name)
                .values(stopping=False, heartbeat_at=silent)
            )
        assert waiting_for() == (NO_EXPORTER, NO_EXPORTER)
        with session_scope(engine) as s:
            s.execute(delete(WorkerRow).where(WorkerRow.name == name))


def test_torchyard_export_with_no_exporter_warns_and_gives_up_at_its_timeout_with_exit_1(
    client: TestClient,
    engine: Engine,
    live_api: str,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
    tmp_path: Path,
) -> None:
    """The live API serves the session's export queue, which no exporter consumes while this
    module runs (an exporter of another module is stopped, or silent, by then)."""
    job_id = _job(client, project, dataset, pool)
    checkpoint_id = _checkpoint(engine, job_id, 10, tmp_path)
    cli = cli_invoker(live_api, project.api_key, tmp_path)
    out = tmp_path / "model.safetensors"
    done = cli("export", str(job_id), str(checkpoint_id), "--out", str(out), "--timeout", "2",
               "--poll", "0.5")  # fmt: skip
    assert done.exit_code == 1, done.output
    assert f"warning: {NO_EXPORTER}" in done.output
    assert f"still pending after 2 s: {NO_EXPORTER}" in done.output
    assert not out.exists()


def test_two_requests_racing_for_one_export_both_get_it_and_no_500(
    client: TestClient,
    engine: Engine,
    project: ProjectKey,
    exportable: Exportable,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another request commits the export between this request's lookup and its insert (the
    dashboard's Export clicked twice; found by the dashboard test as a 500): this one answers
    with that export, and one row exists."""
    from core.jobs import exports as exports_module

    complete = exports_module.storage.checkpoint_complete
    raced: list[int] = []

    def racing_request(uri: str) -> bool:
        if not raced:  # the other request, in a session (and connection) of its own
            with session_scope(engine) as s:
                row = CheckpointExport(
                    job_id=exportable.job_id, checkpoint_id=exportable.checkpoint_id, step=10,
                    source_uri=uri, uri=uri + "-export", state="pending", attempt=0,
                    created_at=utcnow(),
                )  # fmt: skip
                s.add(row)
                s.flush()
                raced.append(row.id)
        return complete(uri)

    monkeypatch.setattr(exports_module.storage, "checkpoint_complete", racing_request)
    answer = client.post(exportable.path, headers=project.headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == raced[0]
    with session_scope(engine) as s:
        rows = s.scalars(
            select(CheckpointExport.id).where(
                CheckpointExport.checkpoint_id == exportable.checkpoint_id
            )
        ).all()
    assert rows == raced
