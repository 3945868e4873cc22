"""The object store unreachable for 30 s while a job writes checkpoints to it (the worker's S3
endpoint is a TCP proxy the test cuts: connections refused, open ones closed). Whatever the
trainer does meanwhile, a checkpoint is recorded only when it is whole in the bucket, and the
job ends `succeeded` with each step's loss stored once: it rode the outage out, or its attempt
failed and resumed from the previous complete checkpoint."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from api.main import create_app
from core.platform.settings import Settings
from core.platform.storage import checkpoint_complete, job_checkpoint_uri
from core.platform.tables import Checkpoint
from tests.conftest import make_project
from tests.integration.faults.tcp_proxy import TcpProxy
from tests.integration.s3server import S3, s3_fs, under, upload_corpus
from tests.integration.workers.helpers import (
    TERMINAL,
    job_events,
    metric_series,
    start_worker,
    submit,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
)

pytestmark = pytest.mark.s3

STEPS = 300
EVERY = 20
OUTAGE_S = 30.0


@pytest.fixture
def proxy(s3: S3) -> Iterator[TcpProxy]:
    tcp = TcpProxy(("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])))
    yield tcp
    tcp.close()


def _newest_recorded(engine: Engine, job_id: int) -> int:
    with Session(engine) as s:
        found = s.scalar(select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job_id))
    return found or 0


@pytest.mark.long  # ~1.5 min
def test_s3_down_for_30_s_mid_run_never_leaves_a_partial_checkpoint_taken_for_complete(
    engine: Engine,
    s3_settings: Settings,
    s3: S3,
    celery_client: Celery,
    worker_logs: Path,
    corpus_dir: Path,
    proxy: TcpProxy,
) -> None:
    project = make_project(engine)
    with TestClient(create_app(s3_settings), raise_server_exceptions=True) as api:
        dataset_id = upload_corpus(api, project, corpus_dir)
    worker = start_worker(
        settings=s3_settings,
        client=celery_client,
        queue=unique_queue("s3-outage"),
        log_dir=worker_logs,
        extra_env={**s3.env, "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"},
    )
    try:
        spec = tiny_spec(
            pool=worker.queue,
            dataset_id=dataset_id,
            train={"max_steps": STEPS},
            eval={"interval_steps": STEPS},
            checkpoint={"interval_steps": EVERY, "keep_last": 3},
            retries={"max_restarts": 5},  # attempts may fail again while S3 is down
        )
        job_id = submit(engine, celery_client, project, spec)
        wait_for("a first checkpoint recorded", lambda: _newest_recorded(engine, job_id), 180)
        proxy.cut()
        cut = time.monotonic()
        noticed: list[float] = []  # when the attempt's failure was recorded, if it was

        def outage_over() -> bool:
            if not noticed and any(e.state_to == "restarting" for e in job_events(engine, job_id)):
                noticed.append(time.monotonic() - cut)
            return time.monotonic() - cut >= OUTAGE_S

        wait_for("the outage's end", outage_over, OUTAGE_S + 5, 0.5)
        proxy.restore()
        restored = time.monotonic()

        def training_again() -> bool:  # a later attempt's loss (perhaps during the outage)
            return any(p.attempt > 1 for p in metric_series(engine, job_id, "loss"))

        again = None
        if noticed:
            try:
                wait_for("the next attempt to train", training_again, 180)
            except BaseException:
                for e in job_events(engine, job_id):
                    print(e.attempt, e.kind, e.state_to, e.message[:300], e.data)
                print(worker.log[-6000:])
                raise
            again = time.monotonic() - restored
        job = wait_state(engine, job_id, TERMINAL, 300, worker)
    finally:
        worker.stop()
    assert job.state == "succeeded", f"{job.error}\n{worker.log[-4000:]}"
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, STEPS + 1))

    root = job_checkpoint_uri(s3_settings, job_id)
    with Session(engine) as s:
        rows = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id)).all()
    assert rows and all(checkpoint_complete(r.uri) for r in rows), [r.uri for r in rows]
    events = job_events(engine, job_id)
    restarts = [e for e in events if e.state_to == "restarting"]
    for restart in restarts:  # a failed attempt is infra's, resumed from a complete checkpoint
        assert restart.data["failure_class"] in ("infra", "storage"), restart.data
    resumed = [e.data["start_step"] for e in events if e.state_to == "running" and e.attempt > 1]
    recorded = {e.data["step"] for e in events if e.kind == "checkpoint"}
    assert all(step in recorded for step in resumed), (resumed, recorded)
    s3_fs().invalidate_cache()
    left = [p.rsplit("/", 1)[1] for p in s3_fs().ls(under(root))]
    print(
        f"S3 down {OUTAGE_S:.0f} s: attempt failed {noticed} s after the cut, training again "
        f"{again} s after the restore; attempts {job.attempt}, restarts "
        f"{[r.data.get('failure_class') for r in restarts]}, resumed at {resumed}, bucket {left}"
    )
