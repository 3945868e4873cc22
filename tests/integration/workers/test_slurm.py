"""A pool backed by a real Slurm (issue 27): a one-node cluster on this machine
(`scripts/slurm.sh`: Debian's slurm-wlm and munge, `slurmctld` + `slurmd`, partition `debug`),
the pool's submitter a real Celery worker on the pool's queue (`workers.slurm.submitter`), the
node agents started by `srun` inside a real allocation (`workers.slurm.agent`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from api.main import create_app
from core.jobs import service as jobs
from core.platform.settings import Settings
from core.platform.tables import Checkpoint, SlurmJob
from jobspec.job import ScriptJobSpec
from tests.conftest import ProjectKey
from tests.integration.workers.archives import OVER_PY, store_archive
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    job_events,
    job_row,
    metric_series,
    send,
    start_worker,
    submit,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
    wait_step,
)
from tests.integration.workers.probe import WORKER_SECRET, run_probe
from tests.support.tolerances import RTOL
from workers.isolation import cgroups
from workers.slurm import batch
from workers.slurm.submitter import claimed_run

REPO_ROOT = Path(__file__).resolve().parents[3]
TIMEOUT_S = 240.0
# A pause must land mid-run: a tiny step takes ~12 ms on an idle host (20 steps ended before a
# pause asked at step 5 reached the trainer, in CI).
STEPS = 300


def _slurm_up() -> bool:
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


@pytest.fixture(scope="module")
def slurm_cluster() -> None:
    """The one-node cluster, started by `scripts/slurm.sh` when it is not up (needs root: the
    daemons run as root; `.ci/run` runs the script before the suite)."""
    if not _slurm_up():
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip("no Slurm here and no root to start one (bash scripts/slurm.sh)")
        subprocess.run(["bash", str(REPO_ROOT / "scripts" / "slurm.sh")], check=True, timeout=600)
    assert _slurm_up()


def _submitter(
    settings: Settings,
    client: Celery,
    logs: Path,
    pool: dict[str, object] | None = None,
    env: dict[str, str] | None = None,
) -> Worker:
    """A Slurm pool's submitter: `pool` its settings beyond the `debug` partition, `env` more
    of its environment (which its sbatch passes on to the node agents)."""
    queue = unique_queue("slurm")
    pools = {queue: {"partition": "debug", "poll_s": 0.5, **(pool or {})}}
    return start_worker(
        settings=settings,
        client=client,
        queue=queue,
        log_dir=logs,
        extra_env={"TORCHYARD_SLURM_POOLS": json.dumps(pools), **(env or {})},
    )


@pytest.fixture
def submitter(
    slurm_cluster: None, settings: Settings, celery_client: Celery, worker_logs: Path
) -> Iterator[Worker]:
    w = _submitter(settings, celery_client, worker_logs)
    yield w
    w.stop()


def _placements(engine: Engine, job_id: int) -> list[SlurmJob]:
    with Session(engine, expire_on_commit=False) as s:
        query = select(SlurmJob).where(SlurmJob.job_id == job_id).order_by(SlurmJob.id)
        return list(s.execute(query).scalars())


def _closed(engine: Engine, job_id: int) -> bool | None:
    return _placements(engine, job_id)[-1].ended_at is not None or None


def _squeue(slurm_job_id: int) -> batch.SlurmState:
    out = subprocess.run(
        batch.squeue_argv([slurm_job_id]), capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return batch.parse_squeue(out)[slurm_job_id]


def test_a_job_on_the_slurm_pool_trains_through_sbatch_to_the_losses_of_a_celery_pool(
    engine: Engine,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    worker: Worker,
    submitter: Worker,
) -> None:
    """REST-equivalent submit -> the submitter's sbatch -> srun -> the node agent claims and runs
    torchrun -> metrics and checkpoints back -> succeeded; the same spec on the module's Celery
    worker gives the same losses. The job's worker is the Slurm job's agent, and Slurm says the
    allocation COMPLETED."""
    spec = tiny_spec(pool=submitter.queue, dataset_id=dataset_id)
    on_slurm = submit(engine, celery_client, project, spec)
    job = wait_state(engine, on_slurm, TERMINAL, TIMEOUT_S, submitter)
    assert job.state == "succeeded", (job.error, job.failure)
    placements = _placements(engine, on_slurm)
    assert len(placements) == 1 and placements[0].claimed, placements
    slurm_job_id = placements[0].slurm_job_id
    assert slurm_job_id is not None
    assert job.worker is not None and job.worker.startswith(f"slurm-{slurm_job_id}.0@"), job.worker
    # The agent exits after recording the end; then Slurm ends the allocation.
    wait_for("Slurm to complete the allocation",
             lambda: _squeue(slurm_job_id).state == "COMPLETED" or None, 60)  # fmt: skip
    wait_for("the placement to close", lambda: _closed(engine, on_slurm), 30)
    assert job_row(engine, on_slurm).state == "succeeded"  # the watcher's end changed nothing
    with Session(engine) as s:
        steps = s.execute(select(Checkpoint.step).where(Checkpoint.job_id == on_slurm)).scalars()
        assert max(steps, default=None) == 24  # the final one (retention keeps the latest)

    reference_spec = tiny_spec(pool=worker.queue, dataset_id=dataset_id)
    on_celery = submit(engine, celery_client, project, reference_spec)
    reference = wait_state(engine, on_celery, TERMINAL, TIMEOUT_S, worker)
    assert reference.state == "succeeded", reference.error
    slurm_losses = [p.value for p in metric_series(engine, on_slurm, "loss")]
    celery_losses = [p.value for p in metric_series(engine, on_celery, "loss")]
    assert len(slurm_losses) == 24, slurm_losses
    # Same code, spec, seed and threads on the same machine: the same sums in the same order.
    assert slurm_losses == pytest.approx(celery_losses, rel=RTOL)


def test_a_held_job_shows_slurms_reason_and_cancelling_it_scancels_the_allocation(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    slurm_cluster: None,
    worker_logs: Path,
) -> None:
    """A job Slurm holds (`--hold`: PENDING, reason JobHeldUser) is `queued` in Torchyard with
    Slurm's state and reason as its queue reason in `GET /v1/jobs/{id}`; cancelling it there
    cancels the Slurm job (scancel), and no agent ever claims it."""
    held = _submitter(settings, celery_client, worker_logs, {"sbatch_args": ["--hold"]})
    try:
        spec = tiny_spec(pool=held.queue, dataset_id=dataset_id)
        job_id = submit(engine, celery_client, project, spec)
        app = create_app(settings)

        def reason() -> str | None:
            with TestClient(app) as client:
                body = client.get(f"/v1/jobs/{job_id}", headers=project.headers).json()
            text = (body.get("queue") or {}).get("reason") or ""
            return text if "JobHeldUser" in text else None

        shown = wait_for("Slurm's reason on the job", reason, 60)
        assert shown.startswith("slurm PENDING (JobHeldUser), Slurm job "), shown
        (placement,) = _placements(engine, job_id)
        assert placement.slurm_job_id is not None
        assert job_row(engine, job_id).state == "queued"

        with TestClient(app) as client:
            answer = client.post(f"/v1/jobs/{job_id}/cancel", headers=project.headers)
        assert answer.status_code == 202, answer.text
        slurm_id = placement.slurm_job_id
        wait_for("the Slurm job to be cancelled",
                 lambda: _squeue(slurm_id).state == "CANCELLED" or None, 60)  # fmt: skip
        wait_for("the placement to close", lambda: _closed(engine, job_id), 30)
        (placement,) = _placements(engine, job_id)
        assert not placement.claimed
        assert job_row(engine, job_id).state == "cancelled"
    finally:
        held.stop()


def test_pause_on_slurm_checkpoints_and_ends_the_allocation_and_resume_places_a_new_one(
    engine: Engine,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    submitter: Worker,
) -> None:
    """Pause reaches the node agent as on any worker: the trainer checkpoints and stops, the job
    is `paused`, the allocation ends; resume sends it to the submitter again, a second sbatch's
    agent resumes from the pause's checkpoint, and every step is trained and reported once."""
    at_the_end = {"interval_steps": STEPS}  # the pause's checkpoint is the only one before it
    spec = tiny_spec(pool=submitter.queue, dataset_id=dataset_id, train={"max_steps": STEPS},
                     checkpoint=at_the_end, eval=at_the_end)  # fmt: skip
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, 5, TIMEOUT_S)
    with Session(engine) as s:
        assert jobs.pause(session=s, job_id=job_id).state == "pausing"
        s.commit()
    paused = wait_state(engine, job_id, ("paused",), 60, submitter)
    wait_for("the first allocation to end", lambda: _closed(engine, job_id), 60)
    saved = [e.data["step"] for e in job_events(engine, job_id) if e.kind == "checkpoint"]
    assert saved == [paused.current_step]

    with Session(engine) as s:
        assert jobs.resume(session=s, job_id=job_id).state == "queued"
        s.commit()
    send(celery_client, job_id, submitter.queue)
    job = wait_state(engine, job_id, TERMINAL, TIMEOUT_S, submitter)
    assert job.state == "succeeded", (job.error, job.failure)
    assert job.attempt == 2 and job.restarts_used == 0
    first, second = _placements(engine, job_id)
    assert first.claimed and second.claimed and first.slurm_job_id != second.slurm_job_id
    resumed = next(e for e in job_events(engine, job_id) if e.state_to == "running" and
                   e.attempt == 2)  # fmt: skip
    assert resumed.data["start_step"] == saved[0]
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, STEPS + 1))


def test_a_slurm_requeue_mid_run_resumes_from_the_checkpoint_without_spending_a_restart(
    engine: Engine,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    submitter: Worker,
) -> None:
    """`scontrol requeue` (what Slurm's own preemption does) SIGTERMs the allocation's tasks: the
    agent hands the job back with a checkpoint, as a worker shutting down does (no restart
    spent); Slurm starts the same Slurm job again, its agent claims the job's next attempt and
    resumes from that checkpoint; every step is reported once and the job succeeds."""
    steps = 400
    only_at_the_end = {"interval_steps": steps}  # the stop's checkpoint is the only one before
    spec = tiny_spec(pool=submitter.queue, dataset_id=dataset_id, train={"max_steps": steps},
                     checkpoint=only_at_the_end, eval=only_at_the_end)  # fmt: skip
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, 10, TIMEOUT_S)
    (placement,) = _placements(engine, job_id)
    assert placement.slurm_job_id is not None
    slurm_id = str(placement.slurm_job_id)
    subprocess.run(["scontrol", "requeue", slurm_id], check=True, timeout=30)
    # Slurm holds a requeued job back (BeginTime: now + 2 min); let it start once it is pending.
    wait_for("Slurm to requeue the job", lambda: _squeue(int(slurm_id)).state == "PENDING" or None,
             60)  # fmt: skip
    subprocess.run(["scontrol", "update", f"jobid={slurm_id}", "StartTime=now"], check=True,
                   timeout=30)  # fmt: skip
    job = wait_state(engine, job_id, TERMINAL, 2 * TIMEOUT_S, submitter)
    assert job.state == "succeeded", (job.error, job.failure)
    assert job.attempt == 2 and job.restarts_used == 0, (job.attempt, job.restarts_used)
    (same,) = _placements(engine, job_id)  # one sbatch: Slurm requeued its own job
    assert same.slurm_job_id == placement.slurm_job_id
    assert _squeue(placement.slurm_job_id).restarts == 1
    saved = [e.data["step"] for e in job_events(engine, job_id)
             if e.kind == "checkpoint" and e.attempt == 1]  # fmt: skip
    assert len(saved) == 1 and 10 <= saved[0] < steps, saved
    resumed = next(e for e in job_events(engine, job_id) if e.state_to == "running" and
                   e.attempt == 2)  # fmt: skip
    assert resumed.data["start_step"] == saved[0]
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, steps + 1))
    handed = [e.message for e in job_events(engine, job_id) if e.state_to == "restarting"]
    assert handed == ["worker shutting down; attempt 1 handed back"], handed


def test_a_program_over_the_allocations_memory_fails_as_oom(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    slurm_cluster: None,
    worker_logs: Path,
) -> None:
    """The pool asks `--mem` (512 MiB per slot); the node agent gives the job's cgroup that
    memory, so a program that grows past it is OOM-killed inside it and the attempt fails as
    `oom` (not a retryable infra failure), as on a Celery worker."""
    probe = cgroups.create("probe", memory_bytes=None, cpus=None)
    if probe is None:
        pytest.skip("no writable cgroup hierarchy on this host")
    probe.remove()
    small = _submitter(settings, celery_client, worker_logs, {"memory_mb_per_slot": 512})
    try:
        code = store_archive(engine, settings, project, {"over.py": OVER_PY})
        spec = ScriptJobSpec.model_validate({
            "name": "over", "resources": {"procs_per_node": 1, "pool": small.queue},
            "entrypoint": {"code": code, "command": ["python", "over.py"]},
        })  # fmt: skip
        job_id = submit(engine, celery_client, project, spec)
        job = wait_state(engine, job_id, TERMINAL, TIMEOUT_S, small)
        assert job.state == "failed" and job.failure is not None, job.state
        assert job.failure["class"] == "oom", job.failure
        assert _placements(engine, job_id)[0].claimed
    finally:
        small.stop()


def _node_state() -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True,
                         timeout=30, check=True).stdout  # fmt: skip
    return out.split()[0] if out.split() else ""


def test_a_node_that_dies_mid_run_fails_the_attempt_as_node_lost_and_the_retry_resumes(
    engine: Engine,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    submitter: Worker,
) -> None:
    """The node dies hard mid-run (slurmd and every process of the step SIGKILLed, then the node
    set DOWN, as Slurm does when a node stops answering): nobody records the attempt's end, Slurm
    requeues the `--requeue` job, and the submitter's watcher fails the attempt as `node_lost`
    at once (no heartbeat timeout to wait for). `retries.max_restarts: 1` restarts it; once the
    node is back the requeued Slurm job's next run claims attempt 2, which resumes from the
    attempt's last checkpoint and succeeds."""
    steps = 300
    spec = tiny_spec(pool=submitter.queue, dataset_id=dataset_id, train={"max_steps": steps},
                     checkpoint={"interval_steps": 20}, eval={"interval_steps": steps},
                     retries={"max_restarts": 1})  # fmt: skip
    job_id = submit(engine, celery_client, project, spec)
    wait_step(engine, job_id, 45, TIMEOUT_S)  # past two checkpoints
    (placement,) = _placements(engine, job_id)
    slurm_id = str(placement.slurm_job_id)
    pids = subprocess.run(["scontrol", "listpids", slurm_id], capture_output=True, text=True,
                          timeout=30, check=True).stdout.split()[1::5]  # fmt: skip
    try:
        subprocess.run(["pkill", "-9", "-x", "slurmd"], check=False, timeout=30)
        subprocess.run(["pkill", "-9", "-x", "slurmstepd"], check=False, timeout=30)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["scontrol", "update", "nodename=" + socket.gethostname().split(".")[0],
                        "state=down", "reason=torchyard test: node died"], check=True,
                       timeout=30)  # fmt: skip
        lost = wait_for("the attempt to fail as node_lost",
                        lambda: _failure_of(engine, job_id, 1), 60)  # fmt: skip
        assert lost["class"] == "node_lost", lost
        assert "Slurm requeued the allocation" in lost["reason"], lost
    finally:
        subprocess.run(["slurmd"], check=True, timeout=30)
        subprocess.run(["scontrol", "update", "nodename=" + socket.gethostname().split(".")[0],
                        "state=resume"], check=False, timeout=30)  # fmt: skip
        wait_for("the node to be back", lambda: _node_state() in ("idle", "mixed", "allocated")
                 or None, 60)  # fmt: skip
    subprocess.run(["scontrol", "update", f"jobid={slurm_id}", "StartTime=now"], check=False,
                   timeout=30)  # fmt: skip
    job = wait_state(engine, job_id, TERMINAL, 2 * TIMEOUT_S, submitter)
    assert job.state == "succeeded", (job.error, job.failure)
    assert job.attempt == 2 and job.restarts_used == 1, (job.attempt, job.restarts_used)
    # Attempt 2 ran in an allocation of its own: Slurm's requeued run of the dead one, or a new
    # sbatch once Slurm ended that (which it does depends on how the node came back).
    runs = {
        (p.slurm_job_id, claimed_run(job, p.slurm_job_id))
        for p in _placements(engine, job_id)
        if p.slurm_job_id is not None and claimed_run(job, p.slurm_job_id) is not None
    }
    assert runs and runs != {(int(slurm_id), 0)}, (job.worker, runs)
    resumed = next(e for e in job_events(engine, job_id) if e.state_to == "running" and
                   e.attempt == 2)  # fmt: skip
    assert resumed.data["start_step"] >= 40
    assert [p.step for p in metric_series(engine, job_id, "loss")] == list(range(1, steps + 1))


def _failure_of(engine: Engine, job_id: int, attempt: int) -> dict[str, Any] | None:
    for event in job_events(engine, job_id):
        if event.attempt == attempt and event.state_to in ("restarting", "failed"):
            data = event.data or {}
            return {"class": data.get("failure_class"), "reason": data.get("reason")}
    return None


def test_a_job_on_the_slurm_pool_is_sandboxed_like_one_on_a_worker(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    slurm_cluster: None,
    worker_logs: Path,
    tmp_path: Path,
) -> None:
    """The curious tenant's probe (`probe.run_probe`) as a job of the Slurm pool: the node agent
    runs it in the same bubblewrap sandbox as a worker does, so it reaches none of what it looks
    for: not the agent's environment (which holds the submitter's, secret included), not another
    project's files or row cache, not the home, Postgres, Redis or other processes."""
    env = {"TORCHYARD_SANDBOX": "bwrap", "TORCHYARD_DATABASE_URL_NOTE": WORKER_SECRET}
    strict = _submitter(settings, celery_client, worker_logs, env=env)
    try:
        reached, escapes = run_probe(engine, settings, celery_client, strict, project, tmp_path)
    finally:
        strict.stop()
    assert not any(reached.values()), {k: v for k, v in reached.items() if v}
    assert not [name for name, path in escapes.items() if path.exists()]
