"""An entrypoint job on S3 storage (a real S3 server, `moto`), resumed on another host.

The program never holds the storage credentials: it writes its checkpoints to a local staging
directory and the worker uploads each one it completes, recording it only once it is whole in
the bucket (`workers.staging`). Here host A (a worker with a home of its own) runs the first
attempt until a checkpoint is recorded, and is then SIGKILLed with its program, as a lost host
is; host B (another home: none of A's local files) takes the requeued job, downloads the newest
recorded checkpoint into its own staging directory, and the program resumes from it."""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest
from celery import Celery
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from core.platform.models import Checkpoint
from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri
from jobspec.job import ScriptJobSpec
from tests.conftest import ProjectKey, make_project
from tests.integration.s3server import S3, s3_fs, under
from tests.integration.workers.archives import STEPS_PY, store_archive
from tests.integration.workers.helpers import (
    TERMINAL,
    job_events,
    metric_series,
    start_worker,
    submit,
    unique_queue,
    wait_for,
    wait_state,
)
from workers.staging import COMPLETE_MARKER, staging_dir

pytestmark = pytest.mark.s3

STEPS = 20
EVERY = 5
KEEP_LAST = 2


def _newest_recorded(engine: Engine, job_id: int) -> int | None:
    with Session(engine) as s:
        return s.scalar(select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job_id))


def _spec(code: str, pool: str) -> ScriptJobSpec:
    command = ["python", "steps.py", "--steps", str(STEPS), "--checkpoint-every", str(EVERY)]
    return ScriptJobSpec.model_validate(
        {
            "name": "steps-on-s3",
            "entrypoint": {
                "code": code,
                "command": [*command, "--step-s", "0.4"],
                "keep_last_checkpoints": KEEP_LAST,
            },
            "resources": {"pool": pool},
            "retries": {"max_restarts": 1},
        }
    )


def test_an_entrypoint_job_uploads_its_checkpoints_and_resumes_on_another_host_from_the_bucket(
    engine: Engine,
    s3_settings: Settings,
    s3: S3,
    celery_client: Celery,
    worker_logs: Path,
    tmp_path: Path,
) -> None:
    project: ProjectKey = make_project(engine)
    code = store_archive(engine, s3_settings, project, {"steps.py": STEPS_PY})
    queue = unique_queue("s3-script")
    host_a = start_worker(
        settings=s3_settings, client=celery_client, queue=queue, log_dir=worker_logs,
        extra_env=s3.env,
    )  # fmt: skip
    job_id = submit(engine, celery_client, project, _spec(code, queue))
    try:
        wait_for(
            "a checkpoint at step >= 10 recorded (uploaded)",
            lambda: (_newest_recorded(engine, job_id) or 0) >= 2 * EVERY,
            120,
        )
    finally:
        tree = [psutil.Process(host_a.proc.pid), *psutil.Process(host_a.proc.pid).children(True)]
        for proc in tree:
            proc.send_signal(signal.SIGKILL)
        host_a.proc.wait()
    resume_step = _newest_recorded(engine, job_id)
    assert resume_step is not None and resume_step % EVERY == 0, resume_step

    # Host B: a home of its own (its own staging directory), and beat, so its idle reconcile
    # requeues the job host A lost.
    settings_b = s3_settings.model_copy(update={"home": tmp_path / "host-b"})
    host_b = start_worker(
        settings=settings_b, client=celery_client, queue=queue, log_dir=worker_logs,
        extra_env=s3.env, beat=True,
    )  # fmt: skip
    try:
        job = wait_state(engine, job_id, TERMINAL, 180, host_b)
    finally:
        host_b.stop()
    assert job.state == "succeeded", f"{job.error}\n{host_b.log[-4000:]}"
    assert job.attempt == 2

    events = job_events(engine, job_id)
    (started,) = [
        e for e in events if e.message == "steps program started" and e.attempt == 2
    ]  # fmt: skip
    assert started.data["start_step"] == resume_step  # B read the checkpoint from the bucket
    assert (staging_dir(settings_b, job_id) / f"step_{STEPS:08d}" / "state.json").exists()
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, STEPS + 1))

    root = job_checkpoint_uri(s3_settings, job_id)
    with Session(engine) as s:
        rows = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)).all()
    kept = [STEPS - EVERY * i for i in reversed(range(KEEP_LAST))]
    assert sorted(r.step for r in rows) == kept
    assert all(r.uri == f"{root}/step_{r.step:08d}" for r in rows)
    s3_fs().invalidate_cache()
    on_s3 = sorted(p.rsplit("/", 1)[1] for p in s3_fs().ls(under(root)))
    assert [n for n in on_s3 if n.startswith("step_")] == [f"step_{k:08d}" for k in kept]
    for step in kept:
        names = {p.rsplit("/", 1)[1] for p in s3_fs().find(under(f"{root}/step_{step:08d}"))}
        assert names == {"state.json", COMPLETE_MARKER}
    recorded = [e for e in events if e.kind == "checkpoint"]
    assert all(e.data["uri"].startswith(root) for e in recorded)
