"""A hung rank (SIGSTOPped from outside) is found by the worker's watchdog: its stacks land
in the job's logs and a `hang` event, and the attempt is stopped and leaves no process."""

from __future__ import annotations

import contextlib
import signal
import time

import psutil
from celery import Celery
from sqlalchemy import Engine

from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    create_job,
    group_gone,
    job_events,
    job_row,
    launches,
    log_lines,
    send,
    tiny_spec,
    wait_for,
    wait_state,
)

HANG_TIMEOUT_S = 6.0
# Ingest (0.5 s) and watchdog (1 s) ticks, two py-spy dumps, the SIGTERM stop (or the 8 s
# SIGKILL grace), on two cores shared with other tests.
MARGIN_S = 30.0


def _rank(pgid: int, rank: int) -> psutil.Process | None:
    for child in psutil.Process(pgid).children():
        with contextlib.suppress(psutil.Error, KeyError):
            if child.environ()["RANK"] == str(rank):
                return child
    return None


def test_a_stopped_rank_is_a_hang_with_its_stacks_in_the_logs_and_no_process_left(
    engine: Engine, celery_client: Celery, project: ProjectKey, dataset_id: str, worker: Worker
) -> None:
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        train={"max_steps": 100_000},
        checkpoint={"interval_steps": 100_000},
        resources={"procs_per_node": 2},
        limits={"hang_timeout_s": HANG_TIMEOUT_S},
        retries={"max_restarts": 0},
    )
    job_id = create_job(engine, project, spec)
    send(celery_client, job_id, worker.queue)
    wait_for("step 3", lambda: (job_row(engine, job_id).current_step or 0) >= 3, 120)
    (launch,) = launches(job_events(engine, job_id))
    pgid = launch.data["pgid"]
    stopped = wait_for("rank 1's process", lambda: _rank(pgid, 1), 10)
    ranks = [stopped, _rank(pgid, 0)]
    stopped.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        job = wait_state(engine, job_id, TERMINAL, HANG_TIMEOUT_S + MARGIN_S, worker)
    finally:
        with contextlib.suppress(psutil.Error):
            stopped.send_signal(signal.SIGKILL)  # whatever happened, leave nothing behind
    left_running_after = time.monotonic() - stopped_at
    assert job.state == "failed", job.error
    assert "(hang)" in (job.error or "")  # "... after the worker stopped it (hang)"
    assert HANG_TIMEOUT_S <= left_running_after < HANG_TIMEOUT_S + MARGIN_S

    events = job_events(engine, job_id)
    (hang,) = [e for e in events if e.kind == "hang"]
    last_step = hang.data["step"]
    assert last_step >= 3
    assert hang.message.startswith("no step progress for ")
    assert hang.message.endswith(f" s (last step {last_step})")
    idle_s = int(hang.message.split()[4])
    assert HANG_TIMEOUT_S <= idle_s < HANG_TIMEOUT_S + MARGIN_S
    assert sorted(s["rank"] for s in hang.data["stacks"]) == [0, 1]
    assert all(s["tool"] == "py-spy" and "train_loop" in s["text"] for s in hang.data["stacks"])

    stacks = [x for x in log_lines(engine, job_id) if x.stream == "stacks" and x.rank == 1]
    assert stacks[0].line == (
        f"--- stacks of rank 1 (py-spy, hang after {idle_s} s without progress) ---"
    )
    text = "\n".join(x.line for x in stacks)
    assert "train_loop" in text and "trainer/loop.py" in text

    wait_for("the trainer's process group to be gone", lambda: group_gone(pgid), 10)
    alive = [p for p in ranks if p is not None and p.is_running() and p.status() != "zombie"]
    assert alive == []
