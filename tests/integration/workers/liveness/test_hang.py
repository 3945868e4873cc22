"""A hung rank (SIGSTOPped from outside) is found by the worker's watchdog: its stacks land
in the job's logs and a `hang` event, and the attempt is stopped and leaves no process. The
watchdog's clock and timeout are checked on a real ingest at chosen times first."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from celery import Celery
from sqlalchemy import Engine

from core.platform.db import session_factory
from core.platform.settings import Settings
from jobspec.job import LimitsSpec
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    RANK_SPAWN_S,
    TERMINAL,
    UNTIL_STOPPED,
    Worker,
    group_gone,
    job_events,
    launches,
    left_running,
    log_lines,
    rank_process,
    submit,
    tiny_spec,
    wait_for,
    wait_state,
    wait_step,
)
from workers.ingest import RunIngest
from workers.launcher import RunPaths
from workers.supervisor import Stop
from workers.watchers.watchdog import Watchdog

HANG_TIMEOUT_S = 6.0
# Ingest (0.5 s) and watchdog (1 s) ticks, two py-spy dumps, the SIGTERM stop (or the 8 s
# SIGKILL grace), on two cores shared with other tests.
MARGIN_S = 30.0


def _steps(*times: float) -> bytes:
    """Metric lines of steps 1, 2, ... reported at unix `times`."""
    return b"".join(
        json.dumps(
            {"type": "metric", "time": t, "attempt": 1, "step": s, "values": {"loss": 1.0}}
        ).encode()
        + b"\n"
        for s, t in enumerate(times, 1)
    )


@pytest.fixture
def childless() -> Iterator[int]:
    """The pid of a process without children: a torchrun whose ranks are gone."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc.pid
    proc.kill()
    proc.wait()


def _watchdog(
    engine: Engine, settings: Settings, job_id: int, run_dir: Path, pgid: int, **limits: float
) -> Watchdog:
    ingest = RunIngest(
        paths=RunPaths(run_dir=run_dir, checkpoint_dir="ckpt", data="data"),
        job_id=job_id,
        attempt=1,
    )
    return Watchdog(
        settings=settings,
        limits=LimitsSpec(**limits),
        ingest=ingest,
        pgid=pgid,
        session_factory=session_factory(engine),
    )


def test_the_watchdog_waits_for_the_first_step_then_stops_after_the_timeout_once(
    engine: Engine, settings: Settings, claimed_job: int, tmp_path: Path, childless: int
) -> None:
    dog = _watchdog(engine, settings, claimed_job, tmp_path, childless, hang_timeout_s=6)
    assert dog.tick(time.monotonic() + 3600) is None  # setup: no step yet, never a hang
    (tmp_path / "events.jsonl").write_bytes(_steps(100.0, 101.0))
    dog.ingest.flush(session_factory(engine))
    seen = dog.ingest.progress.observed_at
    assert seen is not None
    assert dog.tick(seen + 5.9) is None and dog.reason is None
    assert dog.tick(seen + 6.2) is Stop.HANG
    assert dog.reason == "no step progress for 6 s (last step 2)"
    assert dog.tick(seen + 60) is None  # once
    (hang,) = [e for e in job_events(engine, claimed_job) if e.kind == "hang"]
    assert hang.message == dog.reason
    assert hang.data["step"] == 2 and hang.data["timeout_s"] == 6 and hang.data["stacks"] == []


def test_without_a_configured_timeout_it_is_ten_median_report_gaps_at_least_the_floor(
    engine: Engine, settings: Settings, claimed_job: int, tmp_path: Path, childless: int
) -> None:
    floor = settings.model_copy(update={"hang_timeout_floor_s": 20.0})
    dog = _watchdog(engine, floor, claimed_job, tmp_path, childless)
    assert dog.timeout_s() == 20.0  # no median yet
    (tmp_path / "events.jsonl").write_bytes(_steps(100.0, 103.0, 106.0, 109.5))
    dog.ingest.flush(session_factory(engine))
    assert dog.timeout_s() == 30.0  # 10 x the median gap of 3 s
    seen = dog.ingest.progress.observed_at
    assert seen is not None
    assert dog.tick(seen + 29) is None and dog.tick(seen + 31) is Stop.HANG


def test_a_stopped_rank_is_a_hang_with_its_stacks_in_the_logs_and_no_process_left(
    engine: Engine, celery_client: Celery, project: ProjectKey, dataset_id: str, worker: Worker
) -> None:
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        **UNTIL_STOPPED,
        resources={"procs_per_node": 2},
        limits={"hang_timeout_s": HANG_TIMEOUT_S},
        retries={"max_restarts": 0},
    )
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, 3, 120)
    (launch,) = launches(job_events(engine, job_id))
    pgid = launch.data["pgid"]
    stopped = wait_for("rank 1's process", lambda: rank_process(pgid, 1), RANK_SPAWN_S)
    ranks = [stopped, rank_process(pgid, 0)]
    stopped.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        job = wait_state(engine, job_id, TERMINAL, HANG_TIMEOUT_S + MARGIN_S, worker)
    finally:
        with contextlib.suppress(psutil.Error):
            stopped.send_signal(signal.SIGKILL)  # whatever happened, leave nothing behind
    left_running_after = time.monotonic() - stopped_at
    assert job.state == "failed", job.error
    # The lifecycle classes the attempt `hang`, with the watchdog's words as its reason.
    assert job.failure is not None and job.failure["class"] == "hang", job.error
    assert job.failure["reason"].startswith("no step progress for"), job.failure
    assert (job.error or "").startswith("[hang] no step progress for"), job.error
    assert left_running_after < HANG_TIMEOUT_S + MARGIN_S  # the idle time is checked below

    events = job_events(engine, job_id)
    (hang,) = [e for e in events if e.kind == "hang"]
    last_step = hang.data["step"]
    assert last_step >= 3
    assert hang.message.startswith("no step progress for ")
    assert hang.message.endswith(f" s (last step {last_step})")
    assert job.failure["reason"] == hang.message  # the watchdog's reason, on the job
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
    assert left_running([p for p in ranks if p is not None]) == []
