"""A database outage while a job trains costs nothing: the trainer runs on, nothing is lost."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from core.platform.settings import Settings
from core.platform.storage import job_run_dir
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    create_job,
    job_events,
    job_row,
    log_lines,
    metric_series,
    tiny_spec,
    unique_queue,
)
from workers import node

FAILED_SESSIONS = 8  # ~1.5 s of flushes and heartbeats at the test settings' intervals


def test_supervision_rides_out_a_database_outage_mid_run(
    engine: Engine,
    settings: Settings,
    project: ProjectKey,
    dataset_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the trainer has written its first event, the worker's next sessions fail
    (connection refused); flushes and heartbeats are retried until the database is back."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the trainer inherits this process's env
    pool = unique_queue("outage")
    job_id = create_job(engine, project, tiny_spec(pool=pool, dataset_id=dataset_id))
    events_file = job_run_dir(settings, job_id, 1) / "events.jsonl"
    unreachable = create_engine(
        "postgresql+psycopg://postgres@127.0.0.1:1/none", connect_args={"connect_timeout": 1}
    )
    failed_sessions = 0

    def sessions() -> Session:
        nonlocal failed_sessions
        if events_file.exists() and failed_sessions < FAILED_SESSIONS:
            failed_sessions += 1
            return Session(unreachable, expire_on_commit=False)
        return Session(engine, expire_on_commit=False)

    sent: list[tuple[int, str]] = []
    outcome = node.run_job(
        job_id,
        settings=settings,
        factory=sessions,
        worker="in-process",
        dispatch=lambda *args: sent.append(args),
        shutdown=threading.Event(),
    )
    unreachable.dispose()

    assert outcome == "succeeded" and sent == []
    assert failed_sessions == FAILED_SESSIONS  # the outage really hit the supervision
    job = job_row(engine, job_id)
    assert (job.state, job.attempt, job.exit_code) == ("succeeded", 1, 0)
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, 25))
    events = job_events(engine, job_id)
    assert [e.data["step"] for e in events if e.kind == "checkpoint"] == [10, 20, 24]
    assert [e.state_to for e in events if e.kind == "state"] == [
        "queued", "starting", "running", "succeeded",
    ]  # fmt: skip
    lines = log_lines(engine, job_id)
    stored = {(x.rank, x.stream, x.offset) for x in lines}
    assert len(stored) == len(lines)
    rank0 = Path(job_run_dir(settings, job_id, 1), "logs")
    (stdout,) = rank0.glob("*/attempt_0/0/stdout.log")
    assert sum(1 for x in lines if (x.rank, x.stream) == (0, "stdout")) == len(
        stdout.read_bytes().splitlines()
    )
