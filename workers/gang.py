"""One node of a multi-node (gang) attempt: assemble, launch this node's torchrun, end.

Node 0 is the worker whose `workers.run_job` delivery claimed the job (`lead`); every other
node is a worker that took a `workers.join_gang(job_id, attempt)` message (`join`). The slots,
the release of a gang that does not assemble and the aggregation of the nodes' ends live in
`core.gang`; this module only waits, launches and supervises.

The end of the gang: a node whose trainer failed (non-zero exit the worker did not ask for)
ends the whole attempt at once with the usual verdict (restart from the latest checkpoint
while `retries.max_restarts` lasts, else failed); the other nodes then find the attempt no
longer theirs and kill their trainers (their ranks usually fail first anyway, their peers
gone). Any other end (success, a stop for cancel / pause / shutdown / max_runtime) waits for
every node: the last one records the job's end from what all of them reported.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable

from pydantic import ValidationError
from sqlalchemy import update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from core import gang
from core.errors import DomainError
from core.jobs import ACTIVE_STATES
from core.models import Job, JobState, utcnow
from core.settings import Settings
from trainer.spec import JobSpec
from workers import devices, launcher
from workers.attempt import (
    DB_RETRIES,
    Dispatch,
    dispatch_safely,
    exit_code,
    fail_unlaunched,
    prepare,
    record_end,
    record_launch,
    runtime_budget,
    with_db_retry,
)
from workers.ingest import RunIngest
from workers.launcher import RunPaths
from workers.supervisor import Exit, Stop, Supervisor

log = logging.getLogger(__name__)

JoinDispatch = Callable[[int, int, str], None]  # (job_id, attempt, queue) -> workers.join_gang
POLL_S = 0.25  # how often a waiting node looks at the gang


def lead(
    job: Job,
    *,
    settings: Settings,
    factory: Callable[[], Session],
    worker: str,
    dispatch: Dispatch,
    send_join: JoinDispatch,
    shutdown: threading.Event,
    lease: devices.Lease,
) -> str:
    """Node 0 of the claimed attempt `job`: publish the rendezvous, call the other nodes, wait
    for them, then run this node on the leased devices. Returns the outcome."""
    try:
        spec = job.spec
        paths = prepare(settings, factory, job, spec, node_rank=0)
    except (ValidationError, DomainError, OSError) as exc:
        log.error("job %s: cannot launch: %s", job.id, exc)
        error = exc
        outcome, _ = with_db_retry(factory, lambda s: fail_unlaunched(s, job, error))
        return outcome
    host = settings.advertise_host
    port = launcher.free_port(host)
    with_db_retry(
        factory, lambda s: gang.publish(session=s, job=job, worker=worker, host=host, port=port)
    )
    for _ in range(spec.resources.nodes - 1):
        dispatch_safely(lambda j, q: send_join(j, job.attempt, q), job.id, job.pool)
    waited = _assemble(settings, factory, dispatch, job, node_rank=0, shutdown=shutdown)
    if waited is not None:
        return waited
    return _run_node(settings, factory, dispatch, job, spec, paths, worker, shutdown, 0, lease)


def join(
    job_id: int,
    attempt: int,
    *,
    settings: Settings,
    factory: Callable[[], Session],
    worker: str,
    dispatch: Dispatch,
    send_join: JoinDispatch,
    shutdown: threading.Event,
    allocator: devices.Allocator | None = None,
) -> str:
    """Take a free node slot of attempt `attempt` of job `job_id` and run that node, if this
    worker has `procs_per_node` free devices (`allocator`, default the host's); without them
    the message is dropped and a gang that cannot assemble is released (`_assemble`)."""
    with factory() as session:
        job = session.get(Job, job_id)
        pool = job.pool if job is not None else None
    if job is None or pool is None:
        return "not joined"
    if shutdown.is_set():  # let another worker take this node
        dispatch_safely(lambda j, q: send_join(j, attempt, q), job_id, pool)
        return "worker shutting down"
    allocator = allocator or devices.host_allocator()
    lease = allocator.acquire(job.slots)
    if lease is None:
        log.info("job %s attempt %s: no %s free devices to join", job_id, attempt, job.slots)
        return "not joined"
    try:
        return _join(
            job_id, attempt, lease, settings, factory, worker, dispatch, send_join, shutdown
        )
    finally:
        devices.give_back(allocator, lease, factory=factory, pool=pool, dispatch=dispatch)


def _join(
    job_id: int,
    attempt: int,
    lease: devices.Lease,
    settings: Settings,
    factory: Callable[[], Session],
    worker: str,
    dispatch: Dispatch,
    send_join: JoinDispatch,
    shutdown: threading.Event,
) -> str:
    """`join` once this worker holds the node's devices (`lease`): take a slot, assemble, run."""
    node_rank = with_db_retry(
        factory,
        lambda s: gang.join(
            session=s, job_id=job_id, attempt=attempt, worker=worker, host=settings.advertise_host
        ),
    )
    if node_rank is None:
        log.info("job %s attempt %s: no free node slot (over, released or full)", job_id, attempt)
        return "not joined"
    with factory() as session:
        job = session.get(Job, job_id)
    if job is None or job.attempt != attempt:
        return "lost"
    log.info("job %s attempt %s: joined as node %s", job_id, attempt, node_rank)
    waited = _assemble(settings, factory, dispatch, job, node_rank=node_rank, shutdown=shutdown)
    if waited is not None:
        return waited
    try:
        spec = job.spec
        paths = prepare(settings, factory, job, spec, node_rank=node_rank)
    except (ValidationError, DomainError, OSError) as exc:
        log.error("job %s node %s: cannot launch: %s", job_id, node_rank, exc)
        error = exc
        outcome, _ = with_db_retry(factory, lambda s: fail_unlaunched(s, job, error))
        return outcome
    return _run_node(
        settings, factory, dispatch, job, spec, paths, worker, shutdown, node_rank, lease
    )


def _assemble(
    settings: Settings,
    factory: Callable[[], Session],
    dispatch: Dispatch,
    job: Job,
    *,
    node_rank: int,
    shutdown: threading.Event,
) -> str | None:
    """Wait until every node slot is taken (None) or the attempt is over (its outcome).

    Node 0 releases the gang (back to the queue, re-dispatched) when it has not assembled
    within `gang_assemble_timeout_s`, or when its worker is shutting down. While waiting,
    every node heartbeats its slot and node 0 the job row (the reaper watches both).
    """
    leader = node_rank == 0
    timeout = settings.gang_assemble_timeout_s
    started = time.monotonic()
    give_up = started + (timeout if leader else 2 * timeout + settings.heartbeat_timeout_s)
    while True:
        try:
            with factory() as session:
                current = session.get(Job, job.id, populate_existing=True)
                if current is None or current.attempt != job.attempt:
                    return "lost"
                if current.state in (JobState.CANCELLING, JobState.PAUSING) and leader:
                    outcome, _ = fail_unlaunched(session, job, RuntimeError("stopped"))
                    return outcome
                if current.state != JobState.STARTING:
                    return f"gang {current.state}"
                if gang.assembled(
                    gang.members(session=session, job_id=job.id, attempt=job.attempt)
                ):
                    log.info("job %s attempt %s: gang assembled", job.id, job.attempt)
                    return None
                _beat(session, job, node_rank)
                session.commit()
        except SQLAlchemyError:
            log.exception("job %s: gang poll failed; retrying", job.id)
        now = time.monotonic()
        if leader and (now >= give_up or shutdown.is_set()):
            why = (
                f"node 0's worker is shutting down while {gang.num_nodes(job)} nodes assemble"
                if shutdown.is_set()
                else f"gang of {gang.num_nodes(job)} nodes did not assemble within {timeout:g} s"
            )
            if _release(factory, job, why):
                log.info("job %s attempt %s: %s; released", job.id, job.attempt, why)
                dispatch_safely(dispatch, job.id, job.pool)
                return "gang released"
        elif not leader and now >= give_up:
            return "gang did not assemble"
        time.sleep(POLL_S)


def _release(factory: Callable[[], Session], job: Job, reason: str) -> bool:
    return with_db_retry(
        factory,
        lambda s: gang.release(session=s, job_id=job.id, attempt=job.attempt, reason=reason),
    )


def _beat(session: Session, job: Job, node_rank: int) -> None:
    gang.heartbeat(session=session, job_id=job.id, attempt=job.attempt, node_rank=node_rank)
    if node_rank == 0:
        session.execute(
            update(Job)
            .where(Job.id == job.id, Job.attempt == job.attempt, Job.state.in_(ACTIVE_STATES))
            .values(heartbeat_at=utcnow())
            .execution_options(synchronize_session=False)
        )


def _run_node(
    settings: Settings,
    factory: Callable[[], Session],
    dispatch: Dispatch,
    job: Job,
    spec: JobSpec,
    paths: RunPaths,
    worker: str,
    shutdown: threading.Event,
    node_rank: int,
    lease: devices.Lease,
) -> str:
    """Launch and supervise this node's torchrun of the assembled gang on the leased devices;
    record its end."""
    with factory() as session:
        slots = gang.members(session=session, job_id=job.id, attempt=job.attempt)
    head = slots[0]
    assert head.host is not None and head.port is not None
    nproc = spec.resources.procs_per_node
    node = launcher.GangNode(
        nnodes=len(slots),
        node_rank=node_rank,
        host=head.host,
        port=head.port,
        local_addr=settings.advertise_host,
        join_timeout_s=max(60, int(settings.gang_assemble_timeout_s)),
    )
    argv = launcher.torchrun_argv(
        job_id=job.id,
        attempt=job.attempt,
        nproc_per_node=nproc,
        rdzv_port=head.port,
        paths=paths,
        gang=node,
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
    proc = launcher.spawn(argv, env, paths)
    record_launch(factory, job, proc.pid, argv, worker, node_rank=node_rank, devices=lease.devices)
    ingest = RunIngest(
        paths=paths, job_id=job.id, attempt=job.attempt, node_rank=node_rank, nproc=nproc
    )
    supervisor = Supervisor(
        settings=settings,
        session_factory=factory,
        proc=proc,
        ingest=ingest,
        shutdown=shutdown,
        runtime_budget_s=runtime_budget(job),
        on_heartbeat=lambda s, stop: _node_heartbeat(s, job, node_rank, stop),
    )
    try:
        end = supervisor.run()
    except BaseException:  # hard shutdown or a bug: the trainer is stopped; hand the job back
        crashed = Exit(proc.wait(), Stop.SHUTDOWN, ingest.reported, drained=False)
        try:
            _end_node(factory, dispatch, job, crashed, paths, worker, node_rank, retries=1)
        except Exception:
            log.exception("job %s node %s: could not record the end", job.id, node_rank)
        raise
    log.info(
        "job %s attempt %s node %s: torchrun exited %s (%s)",
        job.id,
        job.attempt,
        node_rank,
        end.returncode,
        end.stop or "by itself",
    )
    if end.stop is Stop.LOST:
        return "lost"
    return _end_node(factory, dispatch, job, end, paths, worker, node_rank)


# The stops one node's worker decides for itself; cancel and pause reach every node through
# the job's state anyway.
GANG_STOPS = frozenset({Stop.SHUTDOWN, Stop.MAX_RUNTIME})


def _node_heartbeat(session: Session, job: Job, node_rank: int, stop: Stop | None) -> str | None:
    """This node's heartbeat (and its own stop, if any); another node's stop, to follow it."""
    peer = gang.heartbeat(
        session=session,
        job_id=job.id,
        attempt=job.attempt,
        node_rank=node_rank,
        stop=str(stop) if stop in GANG_STOPS else None,
    )
    return peer if peer in GANG_STOPS else None


def _end_node(
    factory: Callable[[], Session],
    dispatch: Dispatch,
    job: Job,
    end: Exit,
    paths: RunPaths,
    worker: str,
    node_rank: int,
    *,
    retries: int = DB_RETRIES,
) -> str:
    """Record this node's end; the failing node, or the last node to end, ends the job."""

    def write(session: Session) -> tuple[str, str | None]:
        rc = exit_code(end, paths)
        ended = gang.record_node_end(
            session=session,
            job_id=job.id,
            attempt=job.attempt,
            node_rank=node_rank,
            exit_code=rc,
            stop=None if end.stop is None else str(end.stop),
            completed=end.reported.completed,
        )
        failed = rc != 0 and end.stop is None
        if not (failed or ended.all_ended):
            session.commit()
            return f"node {node_rank} ended; the job ends with the last node", None
        stop = end.stop or (Stop(ended.stop) if ended.stop in GANG_STOPS else None)
        reported = dataclasses.replace(end.reported, completed=ended.completed)
        whole = dataclasses.replace(end, stop=stop, reported=reported)
        return record_end(session, job, whole, paths, worker)

    outcome, pool = with_db_retry(factory, write, retries=retries)
    if pool is not None:
        dispatch_safely(dispatch, job.id, pool)
    return outcome
