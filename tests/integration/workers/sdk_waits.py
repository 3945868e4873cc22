"""Waits through the SDK (`torchyard.Client`) for the tests that drive jobs as a user does
(test_examples.py, test_inputs.py): a job's state, its next checkpoint, its step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.workers.helpers import Worker, wait_for
from torchyard import Client
from torchyard.examples import load_example
from torchyard.types import Job

# Each wait; the hf_trainer example took 163 s from upload to success on a quiet host and one
# wait passed 120 s on a loaded CI host.
TIMEOUT_S = 240.0


def wait_job(client: Client, job_id: int, states: tuple[str, ...], worker: Worker) -> Job:
    """The job once it is in one of `states`; fails the test at once, with the worker's log,
    when it failed or was cancelled instead."""

    def probe() -> Job | None:
        job = client.jobs.get(job_id)
        if job.state in ("failed", "cancelled") and job.state not in states:
            pytest.fail(f"job {job_id} {job.state}: {job.failure}\n{worker.log[-4000:]}")
        return job if job.state in states else None

    return wait_for(
        f"job {job_id} to be {'/'.join(states)}",
        probe,
        TIMEOUT_S,
        0.2,
        explain=lambda: explain(client, job_id, worker),
    )


def explain(client: Client, job_id: int, worker: Worker | None = None) -> str:
    """What a timed-out wait shows: the job's state, its last events and the worker's log tail."""
    job = client.jobs.get(job_id)
    events = list(client.jobs.iter_events(job_id))[-15:]
    lines = [f"job {job_id}: {job.state} at step {job.current_step}, attempt {job.attempt}"]
    lines += [f"  {e.created_at} {e.kind}: {e.message}" for e in events]
    if worker is not None:
        lines.append(f"--- worker {worker.name} log tail\n{worker.log[-4000:]}")
    return "\n".join(lines)


def checkpoint_after(client: Client, job_id: int, step: int) -> int:
    """The step of the job's first recorded checkpoint past `step` (polled)."""

    def probe() -> int | None:
        later = [c.step for c in client.jobs.checkpoints(job_id) if c.step > step]
        return min(later) if later else None

    return wait_for(
        f"a checkpoint past step {step}",
        probe,
        TIMEOUT_S,
        0.05,
        explain=lambda: explain(client, job_id),
    )


def step_passed(client: Client, job_id: int, step: int) -> Job:
    """The job once its run has reported step `step` (polled)."""

    def probe() -> Job | None:
        job = client.jobs.get(job_id)
        return job if (job.current_step or 0) >= step else None

    return wait_for(
        f"the run to pass step {step}",
        probe,
        TIMEOUT_S,
        0.05,
        explain=lambda: explain(client, job_id),
    )


def example_spec(name: str, *, model_dir: Path, dataset_id: str, pool: str) -> dict[str, Any]:
    """A packaged example (`torchyard.examples.load_example`) pointed at the test's model
    directory, dataset and worker pool."""
    spec = load_example(name)
    spec["model"]["hf"]["path_or_id"] = str(model_dir)
    spec["data"]["dataset"] = dataset_id
    spec["resources"]["pool"] = pool
    return spec


def run_to_success(client: Client, spec: dict[str, Any], worker: Worker, timeout_s: float) -> Job:
    """Submit `spec` and wait for its job; fails the test, with the worker's log, unless it
    succeeded within `timeout_s`."""
    job = client.jobs.create(spec)
    done = client.jobs.wait(job.id, poll_s=0.5, timeout_s=timeout_s)
    assert done.state == "succeeded", (done.error, worker.log[-4000:])
    return done
