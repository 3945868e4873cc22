"""One delivery of `workers.run_job`: claim the job, launch torchrun, supervise, record the end.

A delivery that loses the claim (the job is not queued: a duplicate message, a redelivery
after a worker crash) returns at once without touching anything: one trainer per attempt.
A multi-node job (`resources.nodes > 1`) is gang-scheduled: the claimant becomes its node 0
(`workers.gang`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
from collections.abc import Callable

from pydantic import ValidationError
from sqlalchemy.orm import Session

from core import gang, jobs, scheduling
from core.errors import DomainError, InvalidInput
from core.models import Job, JobState
from core.settings import Settings
from workers import devices, launcher
from workers import gang as gang_node
from workers.attempt import (
    DB_RETRIES,
    Dispatch,
    MaxRuntime,
    dispatch_safely,
    fail_unlaunched,
    prepare,
    record_end,
    record_launch,
    runtime_budget,
    with_db_retry,
)
from workers.gang import JoinDispatch
from workers.ingest import RunIngest
from workers.launcher import RunPaths
from workers.supervisor import Exit, Stop, Supervisor

log = logging.getLogger(__name__)


def run_job(
    job_id: int,
    *,
    settings: Settings,
    factory: Callable[[], Session],
    worker: str,
    dispatch: Dispatch,
    shutdown: threading.Event,
    send_join: JoinDispatch | None = None,
    allocator: devices.Allocator | None = None,
) -> str:
    """Run one attempt of job `job_id` if this delivery wins the claim; returns the outcome.

    `factory` makes the short-lived sessions of every DB write; `shutdown` is set when the
    worker is stopping (the trainer is then stopped and the job handed back). `send_join`
    sends the join messages of a multi-node job's other nodes (required for such jobs).
    `allocator`: the worker's devices (default `devices.host_allocator()`); the claim takes
    only a job that fits the free ones, and its lease is held until the attempt ends.
    """
    if shutdown.is_set():
        return _leave_to_another_worker(factory, job_id, dispatch)
    allocator = allocator or devices.host_allocator()
    with devices.claimed(
        allocator,
        lambda fit, reserve: _claim(factory, job_id, worker, fit, reserve),
        settings=settings,
        factory=factory,
        dispatch=dispatch,
    ) as claimed:
        if claimed is None:
            return "not claimed"
        job, lease = claimed
        return _run_claimed(job, lease, settings, factory, worker, dispatch, shutdown, send_join)


def _run_claimed(
    job: Job,
    lease: devices.Lease,
    settings: Settings,
    factory: Callable[[], Session],
    worker: str,
    dispatch: Dispatch,
    shutdown: threading.Event,
    send_join: JoinDispatch | None,
) -> str:
    """The claimed attempt `job`, on the leased devices, from launch to its recorded end."""
    job_id = job.id  # the best queued job of the pool, not necessarily the one named
    budget = runtime_budget(job)
    if budget is not None and budget <= 0:
        over = MaxRuntime(job.runtime_s)
        outcome, _ = with_db_retry(factory, lambda s: fail_unlaunched(s, job, over))
        return outcome
    if gang.num_nodes(job) > 1 and send_join is not None:
        return gang_node.lead(
            job,
            settings=settings,
            factory=factory,
            worker=worker,
            dispatch=dispatch,
            send_join=send_join,
            shutdown=shutdown,
            lease=lease,
        )
    try:
        paths, proc, argv = _launch(settings, factory, job, lease)
    except (ValidationError, DomainError, OSError) as exc:
        log.error("job %s: cannot launch: %s", job_id, exc)
        error = exc
        outcome, _ = with_db_retry(factory, lambda s: fail_unlaunched(s, job, error))
        return outcome
    record_launch(factory, job, proc.pid, argv, worker, devices=lease.devices)
    ingest = RunIngest(paths=paths, job_id=job.id, attempt=job.attempt)
    supervisor = Supervisor(
        settings=settings,
        session_factory=factory,
        proc=proc,
        ingest=ingest,
        shutdown=shutdown,
        runtime_budget_s=budget,
    )
    try:
        end = supervisor.run()
    except BaseException:  # hard shutdown or a bug: the trainer is stopped; hand the job back
        crashed = Exit(proc.wait(), Stop.SHUTDOWN, ingest.reported, drained=False)
        with contextlib.suppress(Exception):
            _end_and_dispatch(factory, dispatch, job, crashed, paths, worker, retries=1)
        raise
    log.info(
        "job %s attempt %s: torchrun exited %s (%s)",
        job_id,
        job.attempt,
        end.returncode,
        end.stop or "by itself",
    )
    if end.stop is Stop.LOST:
        return "lost"
    return _end_and_dispatch(factory, dispatch, job, end, paths, worker, retries=DB_RETRIES)


def _leave_to_another_worker(
    factory: Callable[[], Session], job_id: int, dispatch: Dispatch
) -> str:
    """A delivery that reached a stopping worker: re-send it rather than start a trainer."""
    with factory() as session:
        job = jobs.get(session=session, job_id=job_id)
    if job is not None and job.state == JobState.QUEUED:
        dispatch_safely(dispatch, job_id, job.pool)
    return "worker shutting down"


def _launch(
    settings: Settings, factory: Callable[[], Session], job: Job, lease: devices.Lease
) -> tuple[RunPaths, subprocess.Popen[bytes], list[str]]:
    """Start torchrun for the claimed attempt. Raises ValidationError, DomainError, OSError."""
    spec = job.spec
    if spec.resources.nodes != 1:
        raise InvalidInput(
            f"resources.nodes: {spec.resources.nodes} nodes requested, but this delivery "
            "cannot send the other nodes' join messages"
        )
    paths = prepare(settings, factory, job, spec)
    nproc = spec.resources.procs_per_node
    argv = launcher.torchrun_argv(
        job_id=job.id,
        attempt=job.attempt,
        nproc_per_node=nproc,
        rdzv_port=launcher.free_port(),
        paths=paths,
        max_restarts=spec.retries.max_inplace_restarts,
    )
    env = launcher.trainer_env(
        base=os.environ,
        attempt=job.attempt,
        nproc_per_node=nproc,
        device=spec.resources.device,
        cpu_count=os.cpu_count(),
        devices=lease.devices,
        host_devices=lease.host_devices,
    )
    return paths, launcher.spawn(argv, env, paths), argv


def _end_and_dispatch(
    factory: Callable[[], Session],
    dispatch: Dispatch,
    job: Job,
    end: Exit,
    paths: RunPaths,
    worker: str,
    *,
    retries: int,
) -> str:
    """Record how the attempt ended; send the job again when it went back to the queue."""
    outcome, pool = with_db_retry(
        factory, lambda s: record_end(s, job, end, paths, worker), retries=retries
    )
    if pool is not None:
        dispatch_safely(dispatch, job.id, pool)
    return outcome


def _claim(
    factory: Callable[[], Session],
    job_id: int,
    worker: str,
    max_slots: int | None,
    reserve: scheduling.Reserve,
) -> Job | None:
    """Claim the best queued job of the pool of job `job_id` (the message is a token) that
    needs at most `max_slots` devices (None: any), unless a waiting larger job reserves them."""
    with factory() as session:
        named = jobs.get(session=session, job_id=job_id)
        job = None
        if named is not None:
            job = scheduling.claim_next(
                session=session,
                pool=named.pool,
                worker=worker,
                max_slots=max_slots,
                reserve=reserve,
            )
        if job is None:
            log.info(
                "job %s: not claimed (state %s, %s devices; %s free here): another delivery "
                "has it or it ended, or it does not fit, and no other queued job of its pool "
                "fits",
                job_id,
                named.state if named else "gone",
                named.slots if named else "?",
                "any" if max_slots is None else max_slots,
            )
            return None
        session.commit()
        via = "" if job.id == job_id else f" (first in pool {job.pool!r}; message named {job_id})"
        log.info("job %s: claimed attempt %s by %s%s", job.id, job.attempt, worker, via)
        return job
