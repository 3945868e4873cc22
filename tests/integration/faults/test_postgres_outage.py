"""Postgres unreachable for ~10 s mid-run, for a real Celery worker: the trainer runs on, the
worker buffers (the trainer's files are the buffer) and flushes once the database is back;
no metric point, log line, checkpoint record or event is lost or stored twice.

The outage is a TCP proxy between the worker and the shared Postgres that the test cuts
(nothing listens, open connections are closed), so other test sessions are not disturbed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from core.platform.settings import Settings
from core.platform.storage import job_run_dir
from tests.conftest import ProjectKey
from tests.integration.faults.outages import assert_stored_once
from tests.integration.faults.tcp_proxy import TcpProxy
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    job_events,
    job_row,
    log_lines,
    start_worker,
    submit,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
    wait_step,
)

STEPS = 600
OUTAGE_S = 10.0


@pytest.fixture
def proxy(settings: Settings) -> Iterator[TcpProxy]:
    url = make_url(settings.database_url)
    tcp = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    yield tcp
    tcp.close()


@pytest.fixture
def worker(
    settings: Settings, celery_client: Celery, worker_logs: Path, proxy: TcpProxy
) -> Iterator[Worker]:
    url = make_url(settings.database_url).set(port=proxy.port)
    w = start_worker(
        settings=settings,
        client=celery_client,
        queue=unique_queue("pgdown"),
        log_dir=worker_logs,
        extra_env={"TORCHYARD_DATABASE_URL": url.render_as_string(hide_password=False)},
    )
    yield w
    w.stop()


def last_step_in_file(events: Path) -> int:
    steps = [0]
    for line in events.read_bytes().splitlines():
        event = json.loads(line)
        if event["type"] == "metric":
            steps.append(int(event["step"]))
    return max(steps)


def test_postgres_down_10_s_mid_run_loses_and_duplicates_nothing(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    proxy: TcpProxy,
    worker: Worker,
) -> None:
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        train={"max_steps": STEPS},
        eval={"interval_steps": 200},
        checkpoint={"interval_steps": 200, "keep_last": 5},
    )
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, 20, 120)

    events_file = job_run_dir(settings, job_id, 1) / "events.jsonl"
    proxy.cut()
    cut_at = time.monotonic()
    step_at_cut = last_step_in_file(events_file)
    stored_at_cut = job_row(engine, job_id).current_step or 0

    def outage_over() -> bool:
        return time.monotonic() - cut_at >= OUTAGE_S

    wait_for("the outage to last its time", outage_over, OUTAGE_S + 5, poll_s=0.5)
    during = job_row(engine, job_id)
    trained_meanwhile = last_step_in_file(events_file) - step_at_cut
    proxy.restore()

    # The worker really lost the database: no heartbeat and no progress got through ...
    assert (during.current_step or 0) == stored_at_cut
    silent_s = time.time() - during.heartbeat_at.replace(tzinfo=UTC).timestamp()
    assert silent_s >= OUTAGE_S - 2
    # ... while the trainer went on.
    assert trained_meanwhile > 10

    job = wait_state(engine, job_id, TERMINAL, 240, worker)
    assert job.state == "succeeded", job.error
    assert (job.attempt, job.current_step) == (1, STEPS)  # no restart: the run never stopped
    assert_stored_once(engine, job_id, STEPS, [200, 400, 600])
    assert len([e for e in job_events(engine, job_id) if e.kind == "sample"]) == 1
    lines = log_lines(engine, job_id)
    (stdout,) = Path(job_run_dir(settings, job_id, 1), "logs").glob("*/attempt_0/0/stdout.log")
    assert sum(1 for x in lines if (x.rank, x.stream) == (0, "stdout")) == len(
        stdout.read_bytes().splitlines()
    )
    print(f"outage {OUTAGE_S:.0f} s from step {step_at_cut}: trained {trained_meanwhile} steps "
          f"meanwhile; worker silent {silent_s:.1f} s")  # fmt: skip
