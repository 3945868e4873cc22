"""A trainer that dies mid-run is restarted and resumes from its checkpoint, as if never stopped:
by the platform (a new attempt through the queue) or by torchrun in place (same attempt).

The crash comes from outside: once the first attempt has reported its checkpoint at step 10,
the test SIGKILLs the trainer's ranks (`kill_ranks_after_checkpoint`; every rank paused first,
so the newest complete checkpoint at the kill is known). The steps after it run, and are
reported, twice: the stored series must still hold each step once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from core.platform.storage import job_run_dir
from core.platform.tables import JobEvent
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    job_events,
    job_nodes,
    kill_ranks_after_checkpoint,
    launches,
    log_lines,
    metric_series,
    start_worker,
    submit,
    tiny_spec,
    unique_queue,
    wait_state,
)
from workers.ingest import RESTART_OFFSET_STRIDE
from workers.launcher import RunPaths

# tiny_spec: 24 steps, checkpoints at 10, 20 and the end. The ranks die after the first.
MAX_STEPS = 24
CHECKPOINTS = (10, 20, MAX_STEPS)
KILL_AFTER_CHECKPOINT = 10
KILL_WITHIN_S = 120.0


@pytest.fixture(scope="module")
def faulty_worker(settings: Settings, celery_client: Celery, worker_logs: Path) -> Iterator[Worker]:
    """A worker like any other; the test kills the ranks of the jobs it runs."""
    w = start_worker(
        settings=settings, client=celery_client, queue=unique_queue("faulty"), log_dir=worker_logs
    )
    yield w
    w.stop()


@pytest.fixture(scope="module")
def healthy_worker(
    settings: Settings, celery_client: Celery, worker_logs: Path
) -> Iterator[Worker]:
    w = start_worker(
        settings=settings, client=celery_client, queue=unique_queue("healthy"), log_dir=worker_logs
    )
    yield w
    w.stop()


def _kill_ranks(engine: Engine, settings: Settings, job_id: int) -> int:
    """SIGKILL all the job's ranks after its checkpoint at step 10; returns the step it must
    resume from (10, or 20 when the trainer got that far before the kill)."""
    step = kill_ranks_after_checkpoint(
        engine, settings, job_id, step=KILL_AFTER_CHECKPOINT, timeout_s=KILL_WITHIN_S
    )
    assert step in CHECKPOINTS[:-1], step  # killed mid-run, after a checkpoint
    return step


def _checkpoint_steps(events: list[JobEvent], attempt: int) -> list[int]:
    return [e.data["step"] for e in events if e.kind == "checkpoint" and e.attempt == attempt]


def test_crashed_attempt_restarts_from_checkpoint_and_matches_an_uninterrupted_run(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    faulty_worker: Worker,
    healthy_worker: Worker,
) -> None:
    def submit_to(worker: Worker) -> int:
        spec = tiny_spec(pool=worker.queue, dataset_id=dataset_id, retries={"max_restarts": 1})
        return submit(engine, celery_client, project, spec)

    crashing, reference = submit_to(faulty_worker), submit_to(healthy_worker)
    resume_step = _kill_ranks(engine, settings, crashing)
    ref = wait_state(engine, reference, TERMINAL, 120, healthy_worker)
    job = wait_state(engine, crashing, TERMINAL, 120, faulty_worker)
    assert ref.state == "succeeded", ref.error
    assert job.state == "succeeded", job.error
    assert (job.attempt, job.exit_code) == (2, 0)

    events = job_events(engine, crashing)
    assert [(e.attempt, e.state_from, e.state_to) for e in events if e.kind == "state"] == [
        (0, None, "queued"),
        (1, "queued", "starting"),
        (1, "starting", "running"),
        (1, "running", "restarting"),
        (1, "restarting", "queued"),
        (2, "queued", "starting"),
        (2, "starting", "running"),
        (2, "running", "succeeded"),
    ]
    restarting = next(e for e in events if e.state_to == "restarting")
    # The rank died by SIGKILL without an exception (no error event, no error file); a single
    # rank runs without torchrun, so its own status is the node's: `infra`, retried while
    # max_restarts lasts.
    assert restarting.data == {
        "cause": "failure",
        "attempt": 1,
        "exit_code": -9,
        "failure_class": "infra",
        "reason": "a rank exited without recording an exception (a signal or a hard exit); "
        "the rank was killed by SIGKILL",
    }
    assert restarting.message.startswith("attempt 1 failed (infra): a rank exited without")
    assert (job.restarts_used, job.restarts_by_class) == (1, {"infra": 1})
    first, second = job_nodes(engine, crashing)  # one node slot per attempt
    assert (first.attempt, first.exit_code, second.attempt, second.exit_code) == (1, -9, 2, 0)
    assert first.failure is not None and first.failure["class"] == "infra"
    # The second attempt did not fail; the job keeps the failure it recovered from.
    assert second.failure is None and job.failure == first.failure
    assert len(launches(events)) == 2
    resumed = [e for e in events if e.state_to == "running"][-1]
    assert resumed.data["start_step"] == resume_step
    assert _checkpoint_steps(events, 1)[0] == KILL_AFTER_CHECKPOINT
    assert max(_checkpoint_steps(events, 1)) <= resume_step
    assert _checkpoint_steps(events, 2) == [s for s in CHECKPOINTS if s > resume_step]

    losses = metric_series(engine, crashing, "loss")
    reference_losses = metric_series(engine, reference, "loss")
    assert [p.step for p in losses] == list(range(1, MAX_STEPS + 1))
    assert [p.value for p in losses] == pytest.approx([p.value for p in reference_losses], rel=1e-5)
    assert {p.attempt for p in losses if p.step <= resume_step} == {1}
    assert {p.attempt for p in losses if p.step > resume_step} == {2}


def test_ranks_restarted_in_place_resume_from_checkpoint_within_the_same_attempt(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    faulty_worker: Worker,
    healthy_worker: Worker,
) -> None:
    """Both ranks of torchrun's first run of the worker group are SIGKILLed after the
    checkpoint at step 10; with `max_inplace_restarts: 1` torchrun restarts them (restart 1),
    they resume from the newest complete checkpoint."""

    def submit_to(worker: Worker) -> int:
        spec = tiny_spec(
            pool=worker.queue,
            dataset_id=dataset_id,
            resources={"procs_per_node": 2},
            retries={"max_restarts": 0, "max_inplace_restarts": 1},
        )
        return submit(engine, celery_client, project, spec)

    crashing, reference = submit_to(faulty_worker), submit_to(healthy_worker)
    resume_step = _kill_ranks(engine, settings, crashing)
    ref = wait_state(engine, reference, TERMINAL, 180, healthy_worker)
    job = wait_state(engine, crashing, TERMINAL, 180, faulty_worker)
    assert ref.state == "succeeded", ref.error
    assert job.state == "succeeded", job.error
    assert (job.attempt, job.exit_code) == (1, 0)  # no new attempt through the queue

    events = job_events(engine, crashing)
    assert [(e.attempt, e.state_from, e.state_to) for e in events if e.kind == "state"] == [
        (0, None, "queued"),
        (1, "queued", "starting"),
        (1, "starting", "running"),
        (1, "running", "succeeded"),
    ]
    assert len(launches(events)) == 1
    running = next(e for e in events if e.state_to == "running")
    assert (running.data["restart"], running.data["start_step"]) == (0, 0)
    (restarted,) = [e for e in events if (e.message or "").startswith("ranks restarted in place")]
    assert restarted.message.startswith("ranks restarted in place (restart 1); ")
    assert (restarted.attempt, restarted.data["restart"]) == (1, 1)
    assert restarted.data["start_step"] == resume_step
    checkpoints = _checkpoint_steps(events, 1)  # both runs of the group: one attempt
    assert checkpoints[0] == KILL_AFTER_CHECKPOINT
    after = [s for s in CHECKPOINTS if s > resume_step]
    assert [s for s in checkpoints if s > resume_step] == after  # the restarted run's

    losses = metric_series(engine, crashing, "loss")
    reference_losses = metric_series(engine, reference, "loss")
    assert [p.step for p in losses] == list(range(1, MAX_STEPS + 1))
    assert [p.value for p in losses] == pytest.approx([p.value for p in reference_losses], rel=1e-5)
    assert {p.attempt for p in losses} == {1}

    # Every line of both runs of the worker group is stored once, in its file's order.
    files = RunPaths(run_dir=job_run_dir(settings, crashing, 1), checkpoint_dir="", data="")
    rank_files = files.rank_logs()
    assert {(restart, rank) for restart, rank, _ in rank_files} == {
        (0, 0), (0, 1), (1, 0), (1, 1)
    }  # fmt: skip
    stored = log_lines(engine, crashing)
    for (restart, rank, stream), path in rank_files.items():
        low, high = restart * RESTART_OFFSET_STRIDE, (restart + 1) * RESTART_OFFSET_STRIDE
        mine = sorted(
            (x.offset, x.line)
            for x in stored
            if (x.rank, x.stream) == (rank, stream) and low <= x.offset < high
        )
        assert [line for _, line in mine] == path.read_text().splitlines(), (restart, rank, stream)
    first_run = "\n".join(
        x.line for x in stored if x.rank == 0 and x.offset < RESTART_OFFSET_STRIDE
    )
    # The first run trained past its checkpoint and died before its last checkpoint was whole
    # (on a loaded host the kill may land while that checkpoint is being written, after the
    # last step: steps take 50 ms here).
    assert f"step {resume_step} loss" in first_run
    assert f"step_{resume_step:08d}: " in first_run  # the checkpoint it resumed from, logged
    assert f"step_{MAX_STEPS:08d}: " not in first_run  # the last one never completed
