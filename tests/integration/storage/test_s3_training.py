"""A job trained end to end on S3 storage (a real S3 server, `moto`): a worker and an exporter
whose storage is the bucket, as a production GPU host's is. The dataset is read from the bucket,
DCP checkpoints are written to it and pruned there by retention, a crashed attempt resumes from
the newest complete checkpoint it holds, and an export is written to it and downloaded through
the API. The storage credentials reach the worker and the trainer through their environment
and appear in no answer, event, log line or worker log."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from core.platform.settings import Settings
from core.platform.storage import checkpoint_complete, job_checkpoint_uri
from tests.conftest import ProjectKey, make_project
from tests.integration.s3server import S3, keys, s3_fs, under, upload_corpus
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    job_events,
    kill_ranks_after_checkpoint,
    launches,
    log_lines,
    metric_series,
    start_exporter,
    start_worker,
    submit,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
)

pytestmark = pytest.mark.s3

MAX_STEPS = 24  # tiny_spec's; checkpoints every 10 steps and at the end
KEEP_LAST = 2


@pytest.fixture(scope="module")
def api(s3_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(s3_settings), raise_server_exceptions=True) as client:
        yield client


@pytest.fixture(scope="module")
def worker(
    s3_settings: Settings, s3: S3, celery_client: Celery, worker_logs: Path
) -> Iterator[Worker]:
    w = start_worker(
        settings=s3_settings,
        client=celery_client,
        queue=unique_queue("s3"),
        log_dir=worker_logs,
        extra_env=s3.env,
    )
    yield w
    w.stop()


@dataclass(frozen=True)
class Trained:
    """A job of a project of its own that crashed once after a checkpoint and finished."""

    project: ProjectKey
    job_id: int
    resume_step: int


@pytest.fixture(scope="module")
def trained(
    api: TestClient,
    engine: Engine,
    s3_settings: Settings,
    celery_client: Celery,
    corpus_dir: Path,
    worker: Worker,
) -> Trained:
    project = make_project(engine)
    dataset_id = upload_corpus(api, project, corpus_dir)
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        checkpoint={"keep_last": KEEP_LAST},
        retries={"max_restarts": 1},
    )
    job_id = submit(engine, celery_client, project, spec)
    resume_step = kill_ranks_after_checkpoint(engine, s3_settings, job_id, step=10, timeout_s=180)
    job = wait_state(engine, job_id, TERMINAL, 180, worker)
    assert job.state == "succeeded", f"{job.error}\n{worker.log[-4000:]}"
    return Trained(project, job_id, resume_step)


def test_a_crashed_attempt_resumes_from_the_newest_complete_checkpoint_in_the_bucket(
    engine: Engine, trained: Trained
) -> None:
    assert 10 <= trained.resume_step < MAX_STEPS, trained.resume_step
    events = job_events(engine, trained.job_id)
    resumed = next(e for e in events if e.state_to == "running" and e.attempt == 2)
    assert resumed.data["start_step"] == trained.resume_step
    # every step's loss once: the second attempt went on where the checkpoint left off
    assert [p.step for p in metric_series(engine, trained.job_id, "loss")] == list(
        range(1, MAX_STEPS + 1)
    )


def test_checkpoints_are_complete_in_the_bucket_and_retention_pruned_the_older_ones(
    api: TestClient, s3_settings: Settings, trained: Trained
) -> None:
    root = job_checkpoint_uri(s3_settings, trained.job_id)
    s3_fs().invalidate_cache()
    names = (p.rsplit("/", 1)[1] for p in s3_fs().ls(under(root)))
    on_s3 = sorted(n for n in names if n.startswith("step_"))  # not `unrecorded/`, set aside
    assert on_s3 == ["step_00000020", f"step_{MAX_STEPS:08d}"]
    assert all(checkpoint_complete(f"{root}/{name}") for name in on_s3)
    listed = api.get(f"/v1/jobs/{trained.job_id}/checkpoints", headers=trained.project.headers)
    assert listed.status_code == 200, listed.text
    assert [c["step"] for c in listed.json()["items"]] == [20, MAX_STEPS]
    assert all(c["server_uri"].startswith(f"{root}/step_") for c in listed.json()["items"])


def test_an_export_is_written_to_the_bucket_and_downloaded_through_the_api(
    api: TestClient,
    s3_settings: Settings,
    s3: S3,
    celery_client: Celery,
    worker_logs: Path,
    trained: Trained,
) -> None:
    headers = trained.project.headers
    items = api.get(f"/v1/jobs/{trained.job_id}/checkpoints", headers=headers).json()["items"]
    last = next(c for c in items if c["step"] == MAX_STEPS)
    path = f"/v1/jobs/{trained.job_id}/checkpoints/{last['id']}/export"
    exporter = start_exporter(
        settings=s3_settings, client=celery_client, log_dir=worker_logs, extra_env=s3.env
    )
    try:
        assert api.post(path, headers=headers).status_code in (200, 202)

        def done() -> dict[str, object] | None:
            export = api.get(path, headers=headers).json()
            return export if export["state"] in ("ready", "failed") else None

        export = wait_for("the export", done, 120, 0.2)
    finally:
        exporter.stop()
    assert export["state"] == "ready", f"{export}\n{exporter.log[-4000:]}"
    stored = keys(f"{s3_settings.storage_url}/jobs/{trained.job_id}/exports")
    weights = [k for k in stored if k.endswith("model.safetensors")]
    assert len(weights) == 1, stored
    body = s3_fs().cat_file(under(weights[0]))
    assert hashlib.sha256(body).hexdigest() == export["sha256"]
    download = api.get(f"{path}/download", headers=headers)
    assert download.status_code == 200 and download.content == body
    assert s3.secret not in exporter.log


def test_the_storage_credentials_appear_in_no_answer_event_or_log(
    api: TestClient, engine: Engine, s3: S3, worker: Worker, trained: Trained
) -> None:
    headers, job_id = trained.project.headers, trained.job_id
    answers = [
        api.get(path, headers=headers, params=params).text
        for path, params in (
            (f"/v1/jobs/{job_id}", {}),
            (f"/v1/jobs/{job_id}/events", {"limit": 1000}),
            (f"/v1/jobs/{job_id}/logs", {"limit": 5000}),
            (f"/v1/jobs/{job_id}/checkpoints", {}),
        )
    ]
    events = [f"{e.message} {e.data}" for e in job_events(engine, job_id)]
    lines = [line.line for line in log_lines(engine, job_id)]
    for text in (*answers, *events, *lines, worker.log):
        assert s3.secret not in text and s3.key not in text


def test_a_fine_tune_starts_from_a_checkpoint_in_the_bucket_and_saves_sharded_async_there(
    api: TestClient,
    engine: Engine,
    s3_settings: Settings,
    celery_client: Celery,
    worker: Worker,
    trained: Trained,
) -> None:
    """`model.init_from` of the crashed-and-resumed job, read from the bucket, under FSDP2 on 2
    ranks (DCP reshards), with `dcp.async_save` writing its own sharded checkpoints there."""
    headers = trained.project.headers
    source = api.get(f"/v1/jobs/{trained.job_id}", headers=headers).json()
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=source["spec"]["data"]["dataset"],
        model={"init_from": {"job": trained.job_id}},
        parallelism={"strategy": "fsdp"},
        resources={"procs_per_node": 2},
        train={"max_steps": 4, "micro_batch_size": 2},  # the 4-row eval split, on 2 ranks
        eval={"interval_steps": 4},
        checkpoint={"interval_steps": 2, "async_save": True},
    )
    answer = api.post("/v1/jobs", json=spec.model_dump(mode="json"), headers=headers)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    job = wait_state(engine, job_id, TERMINAL, 180, worker)
    assert job.state == "succeeded", f"{job.error}\n{worker.log[-4000:]}"

    source_root = job_checkpoint_uri(s3_settings, trained.job_id)
    (launch,) = launches(job_events(engine, job_id))
    argv = launch.data["argv"]
    assert argv[argv.index("--init-from") + 1] == f"{source_root}/step_{MAX_STEPS:08d}"
    # Step 0 evaluates the source's final weights, read from the bucket: near the source's
    # final eval loss (other batches: 2 rows a rank here), far below a random init's.
    start = metric_series(engine, job_id, "eval_loss")[0]
    final = metric_series(engine, trained.job_id, "eval_loss")[-1]
    assert start.step == 0
    assert start.value == pytest.approx(final.value, rel=0.05)
    assert start.value < math.log(256) - 0.5  # a byte-level model's loss at random init
    root = job_checkpoint_uri(s3_settings, job_id)
    s3_fs().invalidate_cache()
    saved = sorted(p.rsplit("/", 1)[1] for p in s3_fs().ls(under(root)))
    assert saved == ["step_00000002", "step_00000004"]
    for name in saved:  # one shard file per rank, then the metadata
        assert checkpoint_complete(f"{root}/{name}")
        files = [p.rsplit("/", 1)[1] for p in s3_fs().find(under(f"{root}/{name}"))]
        assert sum(f.endswith(".distcp") for f in files) == 2, files
