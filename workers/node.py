"""One node of an attempt, from claim to end. Every job is a gang of N >= 1 nodes.

Node 0 is the worker whose `workers.run_job` delivery claims the job (`run_job`): in the
claim's transaction it creates the attempt's N node slots (`core.attempts.gang.publish`), takes slot
0 and publishes the rendezvous endpoint, then sends N - 1 `workers.join_gang` messages; every other
node is a worker that took one (`join_gang`). A delivery that loses the claim (a duplicate, a
redelivery after a worker crash) returns at once: one trainer per attempt.

Once every slot is taken (at once for N = 1: no join messages, no waiting) each node runs
`_run_node`: it launches its torchrun (`workers.launcher`: `--nnodes 1` with a local
rendezvous for N = 1, the c10d gang arguments for N > 1), supervises it
(`workers.supervisor`), heartbeating its slot and, node 0, the job row (`_heartbeat`), and
records its end (`_end_node`): under the job row's lock it writes the node's exit facts to its
slot, builds the `NodeEnd` of every ended node and lets `core.attempts.lifecycle_policy.decide` say
what the attempt's end means (`Outcome.WAIT`: other nodes still run), applied by
`core.attempts.lifecycle_apply.apply` in the same transaction. How the node's ranks ended comes from
their recorded exceptions (`workers.exits`), never from torchrun's printed report.

One module of ~500 lines, on purpose: a node's path from claim to end (claim, gang assembly, launch,
supervise, heartbeat, end) is one sequence read top to bottom; the policies it applies live
elsewhere (`core.attempts`, `core.scheduling`, `workers.supervisor`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import psutil
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from core.attempts import gang
from core.attempts import lifecycle_apply as attempts
from core.attempts.gang import Beat
from core.attempts.lifecycle_policy import FailureClass, Outcome, Stop, decide
from core.jobs import outbox
from core.jobs import service as jobs
from core.jobs.service import ACTIVE_STATES
from core.platform.errors import DomainError, InvalidInput
from core.platform.settings import Settings
from core.platform.tables import Job, JobState
from core.scheduling import claim as scheduling
from jobspec.job import SessionJobSpec
from workers import devices, exits, launcher, processes, program
from workers.attempt import (
    DB_RETRIES,
    Dispatch,
    MaxRuntime,
    Unlaunched,
    budget_spent,
    dispatch_safely,
    fail_unlaunched,
    record_hints,
    record_launch,
    runtime_budget,
    with_db_retry,
)
from workers.ingest import RunIngest
from workers.isolation import cgroups, sandbox
from workers.launcher import RunPaths
from workers.supervisor import PEER_STOPS, Exit, Supervisor
from workers.watchers import session_relay, sysmetrics, trials
from workers.watchers.usage_watch import UsageWatch
from workers.watchers.watchdog import hang_watchdog

log = logging.getLogger(__name__)

JoinDispatch = Callable[[int, int, str], None]  # (job_id, attempt, queue) -> workers.join_gang
POLL_S = 0.25  # how often a node waiting for its gang looks at the slots
LAUNCH_ERRORS = (ValidationError, DomainError, OSError, Unlaunched)


def run_job(
    job_id: int,
    *,
    settings: Settings,
    factory: Callable[[], Session],
    worker: str,
    dispatch: Dispatch,
    shutdown: threading.Event,
    send_join: JoinDispatch | None = None,
) -> str:
    """Claim the best queued job of job `job_id`'s pool and run its node 0; returns the outcome.

    `factory` makes the short-lived sessions of every DB write; `shutdown` is set when the
    worker is stopping (the trainer is then stopped and the job handed back); `send_join`
    sends the join messages of a multi-node job's other nodes (required for such jobs).
    """
    if shutdown.is_set():
        return _leave_to_another_worker(factory, job_id, dispatch)
    return claim_and_lead(
        lambda fit, reserve: _claim(settings, factory, job_id, worker, fit, reserve),
        settings=settings,
        factory=factory,
        worker=worker,
        dispatch=dispatch,
        shutdown=shutdown,
        send_join=send_join,
    )


def claim_and_lead(
    claim: Callable[[int | None, scheduling.Reserve], Job | None],
    *,
    settings: Settings,
    factory: Callable[[], Session],
    worker: str,
    dispatch: Dispatch,
    shutdown: threading.Event,
    send_join: JoinDispatch | None,
) -> str:
    """Claim an attempt with `claim(max_slots, reserve)` on this host's free devices
    (`devices.claimed`) and run its node 0 (`lead`); "not claimed" when there was none. The
    Slurm agent's node 0 claims its own job through it (`workers.slurm.agent`)."""
    with devices.claimed(
        devices.host_allocator(), claim, settings=settings, factory=factory, dispatch=dispatch
    ) as claimed:
        if claimed is None:
            return "not claimed"
        job, lease = claimed
        return lead(job, lease, settings, factory, worker, dispatch, shutdown, send_join)


def lead(
    job: Job,
    lease: devices.Lease,
    settings: Settings,
    factory: Callable[[], Session],
    worker: str,
    dispatch: Dispatch,
    shutdown: threading.Event,
    send_join: JoinDispatch | None,
) -> str:
    """Node 0 of the claimed attempt `job` on the leased devices: prepare, call the other
    nodes and wait for them (N > 1), run this node."""
    nodes = gang.num_nodes(job)
    budget = runtime_budget(job)
    refused: Exception | None = None
    if job.spec_problems:  # never run a spec nobody wrote (jobspec.stored)
        refused = InvalidInput(
            "the stored spec cannot be run as written (" + "; ".join(job.spec_problems) + "): "
            "submit it again with today's fields"
        )
    elif budget is not None and budget <= 0:
        refused = MaxRuntime(job.runtime_s)
    elif (spent := budget_spent(settings, factory, job)) is not None:
        refused = spent
    elif nodes > 1 and send_join is None:
        refused = InvalidInput(
            f"resources.nodes: {nodes} nodes requested, but this delivery cannot send the "
            "other nodes' join messages"
        )
    if refused is not None:
        return _fail_unlaunched(factory, job, refused)
    try:
        paths = _prepare(settings, factory, job, 0, worker)
    except LAUNCH_ERRORS as exc:
        return _fail_unlaunched(factory, job, exc)
    except Exception as exc:  # storage unreachable (botocore's errors are no OSError), a bug
        return _fail_preparing(factory, dispatch, job, exc)
    if nodes > 1:
        assert send_join is not None
        for _ in range(nodes - 1):
            dispatch_safely(lambda j, q: send_join(j, job.attempt, q), job.id, job.pool)
        waited = _assemble(settings, factory, dispatch, job, node_rank=0, shutdown=shutdown)
        if waited is not None:
            return waited
    return _run_node(settings, factory, dispatch, job, paths, worker, shutdown, 0, lease)


def join_gang(
    job_id: int,
    attempt: int,
    *,
    settings: Settings,
    factory: Callable[[], Session],
    worker: str,
    dispatch: Dispatch,
    send_join: JoinDispatch,
    shutdown: threading.Event,
) -> str:
    """Take a free node slot of attempt `attempt` of job `job_id` and run that node."""
    with factory() as session:
        job = session.get(Job, job_id)
        pool = job.pool if job is not None else None
    if job is None or pool is None:
        return "not joined"
    if shutdown.is_set():  # let another worker take this node
        dispatch_safely(lambda j, q: send_join(j, attempt, q), job_id, pool)
        return "worker shutting down"
    allocator = devices.host_allocator()
    lease = allocator.acquire(job.slots)
    if lease is None:  # the gang is released if it cannot assemble (`_assemble`)
        log.info("job %s attempt %s: no %s free devices to join", job_id, attempt, job.slots)
        return "not joined"
    try:
        return _join(job_id, attempt, lease, settings, factory, worker, dispatch, shutdown)
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
    shutdown: threading.Event,
) -> str:
    """`join_gang` once this worker holds the node's devices: take a slot, assemble, run."""
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
        paths = _prepare(settings, factory, job, node_rank, worker)
    except LAUNCH_ERRORS as exc:
        return _fail_unlaunched(factory, job, exc)
    except Exception as exc:  # as run_job's
        return _fail_preparing(factory, dispatch, job, exc)
    return _run_node(settings, factory, dispatch, job, paths, worker, shutdown, node_rank, lease)


def _prepare(
    settings: Settings, factory: Callable[[], Session], job: Job, node_rank: int, worker: str
) -> RunPaths:
    """This node's run dir (`workers.program.prepare`), heartbeating while it takes long (an
    entrypoint job's requirements install)."""

    def beat() -> bool:
        """False once the attempt is being cancelled or paused, or is no longer this one."""
        try:
            with factory() as session:
                state = _heartbeat(session, job, node_rank, None).state
                session.commit()
        except SQLAlchemyError:
            log.exception("job %s: heartbeat while preparing failed", job.id)
            return True
        return state not in (None, JobState.CANCELLING, JobState.PAUSING, JobState.PREEMPTING)

    return program.prepare(
        settings,
        factory,
        job,
        node_rank=_node_dir(job, node_rank),
        node_index=node_rank,
        beat=beat,
        worker=worker,
    )


def _node_dir(job: Job, node_rank: int) -> int | None:
    """The run dir's node part: none for a single node (`RUN_DIR` is the attempt's dir)."""
    return None if gang.num_nodes(job) == 1 else node_rank


def _claim(
    settings: Settings,
    factory: Callable[[], Session],
    job_id: int,
    worker: str,
    max_slots: int | None,
    reserve: scheduling.Reserve,
) -> Job | None:
    """Claim the best queued job of the pool of job `job_id` (the message is a token) that
    needs at most `max_slots` devices (None: any), unless a waiting larger job reserves them,
    and create its node slots, node 0 this worker's, in the same transaction."""
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
        # One node rendezvouses locally; a gang at node 0's advertised endpoint.
        host = settings.advertise_host if gang.num_nodes(job) > 1 else "127.0.0.1"
        gang.publish(
            session=session, job=job, worker=worker, host=host, port=launcher.free_port(host)
        )  # commits the claim with the slots
        via = "" if job.id == job_id else f" (first in pool {job.pool!r}; message named {job_id})"
        log.info("job %s: claimed attempt %s by %s%s", job.id, job.attempt, worker, via)
        return job


def _leave_to_another_worker(
    factory: Callable[[], Session], job_id: int, dispatch: Dispatch
) -> str:
    """A delivery that reached a stopping worker: re-send it rather than start a trainer."""
    with factory() as session:
        job = jobs.get(session=session, job_id=job_id)
    if job is not None and job.state == JobState.QUEUED:
        dispatch_safely(dispatch, job_id, job.pool)
    return "worker shutting down"


def _fail_unlaunched(factory: Callable[[], Session], job: Job, exc: Exception) -> str:
    log.error("job %s: cannot launch: %s", job.id, exc)
    return with_db_retry(factory, lambda s: fail_unlaunched(s, job, exc))


def _fail_preparing(
    factory: Callable[[], Session], dispatch: Dispatch, job: Job, exc: Exception
) -> str:
    """An unexpected error while preparing the attempt (storage unreachable, a bug): an
    `infra` failure under the retry policy, so the job is retried, or fails, instead of staying
    `starting` with nobody running it; a restarted job is dispatched again."""
    log.exception("job %s: preparing attempt %s failed", job.id, job.attempt)
    reason = f"preparing the attempt failed: {type(exc).__name__}: {exc}"
    unlaunched = Unlaunched(reason, FailureClass.INFRA, retryable=True)
    outcome = with_db_retry(factory, lambda s: fail_unlaunched(s, job, unlaunched))
    if outcome == str(Outcome.RESTART):
        dispatch_safely(dispatch, job.id, job.pool)
    return outcome


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
    every node heartbeats (`_heartbeat`: its slot, node 0 also the job row).
    """
    leader = node_rank == 0
    timeout = settings.gang_assemble_timeout_s
    give_up = time.monotonic() + (timeout if leader else 2 * timeout + settings.heartbeat_timeout_s)
    while True:
        try:
            with factory() as session:
                current = session.get(Job, job.id, populate_existing=True)
                if current is None or current.attempt != job.attempt:
                    return "lost"
                stopping = (JobState.CANCELLING, JobState.PAUSING, JobState.PREEMPTING)
                if current.state in stopping and leader:
                    return fail_unlaunched(session, job, RuntimeError("stopped"))
                if current.state != JobState.STARTING:
                    return f"gang {current.state}"
                if gang.assembled(
                    gang.members(session=session, job_id=job.id, attempt=job.attempt)
                ):
                    log.info("job %s attempt %s: gang assembled", job.id, job.attempt)
                    return None
                _heartbeat(session, job, node_rank, None)
                session.commit()
        except SQLAlchemyError:
            log.exception("job %s: gang poll failed; retrying", job.id)
        now = time.monotonic()
        if leader and (now >= give_up or shutdown.is_set()):
            nodes = gang.num_nodes(job)
            why = (
                f"node 0's worker is shutting down while {nodes} nodes assemble"
                if shutdown.is_set()
                else f"gang of {nodes} nodes did not assemble within {timeout:g} s"
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


def _heartbeat(session: Session, job: Job, node_rank: int, stop: Stop | None) -> Beat:
    """The one heartbeat of a node: its slot (with its own stop, when the other nodes must
    follow it), and for node 0 the job row. Does not commit."""
    return gang.heartbeat(
        session=session,
        job_id=job.id,
        attempt=job.attempt,
        node_rank=node_rank,
        stop=str(stop) if stop in PEER_STOPS else None,
    )


def _run_node(
    settings: Settings,
    factory: Callable[[], Session],
    dispatch: Dispatch,
    job: Job,
    paths: RunPaths,
    worker: str,
    shutdown: threading.Event,
    node_rank: int,
    lease: devices.Lease,
) -> str:
    """Launch and supervise this node's torchrun of the assembled attempt on the leased
    devices, in a cgroup of its own where the host gives one (`workers.isolation.cgroups`); record
    its end; remove the cgroup."""
    memory, cpus = cgroups.lease_limits(
        leased=len(lease.devices),
        host_slots=lease.host_devices,
        slot_memory_mb=settings.slot_memory_mb,
        total_memory=psutil.virtual_memory().total,
        cpu_count=os.cpu_count() or 1,
    )
    name = cgroups.node_name(job.id, job.attempt, node_rank)
    group = cgroups.create(name, memory_bytes=memory, cpus=cpus)
    try:
        return _launch_node(
            settings, factory, dispatch, job, paths, worker, shutdown, node_rank, lease, group
        )
    finally:
        if group is not None:
            group.remove()
        if paths.input_holds is not None:  # the inputs' cache entries may be evicted again
            paths.input_holds.release()


def _launch_node(
    settings: Settings,
    factory: Callable[[], Session],
    dispatch: Dispatch,
    job: Job,
    paths: RunPaths,
    worker: str,
    shutdown: threading.Event,
    node_rank: int,
    lease: devices.Lease,
    group: cgroups.JobCgroup | None,
) -> str:
    """Launch and supervise this node's torchrun of the assembled attempt on the leased
    devices, in `group` when it has one; record its end."""
    spec = job.spec
    nproc = spec.resources.procs_per_node
    with factory() as session:
        slots = gang.members(session=session, job_id=job.id, attempt=job.attempt)
    head = slots[0]
    assert head.host is not None and head.port is not None
    node = None
    if len(slots) > 1:
        node = launcher.GangNode(
            nnodes=len(slots),
            node_rank=node_rank,
            host=head.host,
            port=head.port,
            local_addr=settings.advertise_host,
            join_timeout_s=max(60, int(settings.gang_assemble_timeout_s)),
        )
    try:
        sandboxed = sandbox.enabled(settings.sandbox, settings.env)
    except sandbox.SandboxUnavailable as exc:
        return _fail_unlaunched(factory, job, exc)
    launch = program.command(job, paths, head.port, node, lease, sandboxed=sandboxed)
    argv = launch.argv
    counter = exits.oom_counter(group)
    oom_kills = counter()
    hints: list[str] = []
    try:
        mounts = None
        if sandboxed:
            mounts = program.sandbox_mounts(settings, job, paths, node, lease)
            hints = program.unseen_paths(job, mounts)
        joins = group.join_fds() if group is not None else ()
        command = argv if mounts is None else sandbox.torchrun_command(argv)
        proc = processes.spawn(
            command,
            launch.env,
            paths,
            cwd=launch.cwd,
            mounts=mounts,
            join_fds=joins,
            grace_s=settings.cancel_grace_s,
            rank_dir=launch.rank_dir,
        )
    except (OSError, sandbox.SandboxUnavailable) as exc:
        return _fail_unlaunched(factory, job, exc)
    gang_rank = None if node is None else node_rank
    pgid = proc.pgid if isinstance(proc, sandbox.SandboxedProcess) else proc.pid
    record_launch(factory, job, pgid, argv, worker, node_rank=gang_rank, devices=lease.devices)
    if hints:
        record_hints(factory, job, hints)
    ingest = RunIngest(
        paths=paths,
        job_id=job.id,
        attempt=job.attempt,
        node_rank=node_rank,
        nproc=nproc,
        dispatch=dispatch,
    )
    is_session = isinstance(spec, SessionJobSpec)
    supervisor = Supervisor(
        settings=settings,
        session_factory=factory,
        proc=proc,
        ingest=ingest,
        shutdown=shutdown,
        heartbeat=lambda s, stop: _heartbeat(s, job, node_rank, stop),
        runtime_budget_s=runtime_budget(job),
        watchers=[
            *sysmetrics.watchers_for(settings, factory, proc.pid, ingest, node_rank),
            # a session's steps come at its client's pace: an idle client is no hang
            *(
                []
                if is_session
                else [hang_watchdog(settings, spec.limits, ingest, proc.pid, factory)]
            ),
            *trials.pruner_for(settings, factory, job, node_rank),
            *session_relay.relay_for(factory, spec, paths.run_dir, node_rank, settings.broker_url),
            UsageWatch(
                settings=settings,
                session_factory=factory,
                root_pid=proc.pid,
                ingest=ingest,
                node_rank=node_rank,
                max_cost=spec.limits.max_cost,
            ),
        ],
    )
    facts = exits.NodeRun(
        paths=paths,
        node_rank=node_rank,
        nproc=nproc,
        oom_kills=oom_kills,
        plain_command=launch.plain_command,
        single_rank=launch.rank_dir is not None,
        oom_counter=counter,
        hints=tuple(hints),
    )
    try:
        end = supervisor.run()
    except BaseException:  # hard shutdown or a bug: the trainer is stopped; hand the job back
        crashed = Exit(proc.wait(), Stop.SHUTDOWN, ingest.reported, drained=False)
        try:
            _end_node(factory, dispatch, job, crashed, facts, retries=1)
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
    return _end_node(factory, dispatch, job, end, facts)


def _end_node(
    factory: Callable[[], Session],
    dispatch: Dispatch,
    job: Job,
    end: Exit,
    facts: exits.NodeRun,
    *,
    retries: int = DB_RETRIES,
) -> str:
    """Record this node's end; decide and apply the attempt's end when it is known (a failed
    node, or the last node to end); dispatch the job when it went back to the queue."""
    mine = exits.node_end(end, facts)

    def write(session: Session) -> tuple[str, str | None]:
        current = gang.lock_job(session, job.id)
        if current is None or current.attempt != job.attempt or current.state not in ACTIVE_STATES:
            session.rollback()
            return "lost", None
        ended = gang.record_node_end(
            session=session,
            job_id=job.id,
            attempt=job.attempt,
            end=mine,
            completed=end.reported.completed,
        )
        decision = decide(attempts.facts_for(current, ended=ended))
        if decision.outcome is Outcome.WAIT:
            session.commit()
            return f"node {mine.node_rank} ended; {decision.message}", None
        failure = decision.failure
        exit_code = next((n.exit_code for n in ended if n.exit_code != 0), 0)
        if failure is not None and failure.exit_code is not None:
            exit_code = failure.exit_code
        pool = attempts.apply(
            session=session,
            job=current,
            decision=decision,
            runtime_s=mine.runtime_s,
            exit_code=exit_code,
            completed=gang.completed_report(session=session, job_id=job.id, attempt=job.attempt),
        )
        outbox.bind(session, dispatch)  # a success's `eval_after` jobs, sent after the commit
        session.commit()
        log.info("job %s attempt %s: %s", job.id, job.attempt, decision.message)
        return str(decision.outcome), pool

    outcome, pool = with_db_retry(factory, write, retries=retries)
    if pool is not None:
        dispatch_safely(dispatch, job.id, pool)
    return outcome
