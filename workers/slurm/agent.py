"""The node agent: what `srun` starts once per node of a Torchyard job's Slurm allocation.

`python -m workers slurm-node --job ID` (from `workers.slurm.batch.script`). On the node Slurm
numbers 0 (`SLURM_NODEID`) the agent claims the job (queued -> starting, attempt + 1; quotas
checked again under their lock, as `core.scheduling.claim` does), creates its node slots with
itself as node 0 and runs node 0 (`workers.node` from the lead on: prepare, wait for the gang,
launch torchrun, supervise, record the end). On every other node it waits until node 0 of the
same allocation has claimed, then takes a node slot (`workers.node.join_gang`). So everything a
Celery worker does for a node (sandbox, cgroup, heartbeats, ingest of the run dir's events,
usage, exit classification, retries) is done here by the same code, and the lifecycle decides
from the same facts.

The agent records `slurm-<SLURM_JOB_ID>.<SLURM_RESTART_COUNT>@<host>` as its worker name and
keeps a `workers` row for it (`workers.liveness`), so the reconciler sees a silent agent as it
sees a silent worker.

SIGTERM sets the shutdown event: Slurm sends it to every process of the step on `scancel`, its
own preemption, `scontrol requeue`, and `--signal=TERM@<s>` before the time limit. torchrun and
the ranks take the same signal (the sandbox's bwrap ignores it: `workers.isolation.keeper`), the
trainer checkpoints at the step boundary, and the node's end is the shutdown's
(`workers.supervisor`): the job is handed back to the queue without spending a restart, as when a
worker shuts down. A requeued Slurm job's agent claims it again; otherwise the submitter places it
again once this allocation is over. Slurm's `KillWait` (and `GraceTime` of a preemptable partition)
must leave the ranks time to write that checkpoint before SIGKILL.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable

from sqlalchemy import update
from sqlalchemy.orm import Session

from core.attempts import gang
from core.jobs import service as jobs
from core.platform.db import get_host_engine, session_factory
from core.platform.settings import Settings, get_settings
from core.platform.tables import TERMINAL_STATES, Job, JobState, SlurmJob, utcnow
from core.scheduling import quotas
from workers import devices, launcher, liveness, node
from workers.attempt import Dispatch
from workers.slurm.submitter import agent_worker

log = logging.getLogger(__name__)

FINAL = tuple(TERMINAL_STATES)
POLL_S = 0.5  # how often a node other than 0 looks whether node 0 has claimed


def _claim(
    settings: Settings,
    factory: Callable[[], Session],
    job_id: int,
    worker: str,
    slurm_job_id: int,
    max_slots: int | None,
) -> Job | None:
    """Claim job `job_id` itself (not the best of its pool: Slurm chose this allocation for it)
    if it is queued, fits `max_slots` and its project's quotas let it start; create its node
    slots with `worker` as node 0. Commits."""
    with factory() as session:
        named = jobs.get(session=session, job_id=job_id)
        if named is None or named.state != JobState.QUEUED:
            return None
        if max_slots is not None and named.slots > max_slots:
            log.error(
                "job %s: needs %s devices, the allocation gives %s", job_id, named.slots, max_slots
            )
            return None
        standing = quotas.standings(
            session=session, pool=named.pool, project_ids=[named.project_id], lock=True
        )[named.project_id]
        blocked = standing.blocked(named.slots * gang.num_nodes(named))
        if blocked is not None:
            log.info("job %s: not claimed: %s", job_id, blocked)
            session.rollback()
            return None
        job = jobs.claim(session=session, job_id=job_id, worker=worker)
        if job is None:
            return None
        job.wait_reason = None
        session.execute(
            update(SlurmJob)
            .where(SlurmJob.slurm_job_id == slurm_job_id, SlurmJob.ended_at.is_(None))
            .values(claimed=True, state="RUNNING")
        )
        host = settings.advertise_host if gang.num_nodes(job) > 1 else "127.0.0.1"
        gang.publish(
            session=session, job=job, worker=worker, host=host, port=launcher.free_port(host)
        )  # commits
        log.info("job %s: claimed attempt %s by %s", job.id, job.attempt, worker)
        return job


def lead(
    job_id: int,
    *,
    settings: Settings,
    factory: Callable[[], Session],
    worker: str,
    slurm_job_id: int,
    dispatch: Dispatch,
    shutdown: threading.Event,
) -> str:
    """Node 0: claim the job and run its node 0 (`workers.node`). The other nodes are this
    allocation's own agents: nobody to send join messages to."""
    return node.claim_and_lead(
        lambda fit, _reserve: _claim(settings, factory, job_id, worker, slurm_job_id, fit),
        settings=settings,
        factory=factory,
        worker=worker,
        dispatch=dispatch,
        shutdown=shutdown,
        send_join=_no_join,
    )


def _no_join(job_id: int, attempt: int, queue: str) -> None:
    """The other nodes of a Slurm allocation join by themselves (`follow_lead`)."""


def follow_lead(
    job_id: int,
    *,
    settings: Settings,
    factory: Callable[[], Session],
    worker: str,
    slurm_job_id: int,
    dispatch: Dispatch,
    shutdown: threading.Event,
) -> str:
    """A node other than 0: once node 0 of this allocation has claimed, join its gang."""
    give_up = time.monotonic() + 2 * settings.gang_assemble_timeout_s
    while not shutdown.is_set():
        with factory() as session:
            job = session.get(Job, job_id)
            if job is None or job.state in FINAL:
                return "over"
            attempt = job.attempt
            ours = (job.worker or "").startswith(worker.partition("@")[0] + "@")
            starting = job.state == JobState.STARTING
        if ours and starting:
            return node.join_gang(
                job_id,
                attempt,
                settings=settings,
                factory=factory,
                worker=worker,
                dispatch=dispatch,
                send_join=_no_join,
                shutdown=shutdown,
            )
        if time.monotonic() >= give_up:
            return "node 0 of this allocation never claimed"
        time.sleep(POLL_S)
    return "shutting down"


def node_address() -> str:
    """The address the other nodes of the allocation reach this one at: the local address of
    the route to the batch host (`SLURM_LAUNCH_NODE_IPADDR`, Slurm's node 0, where the gang's
    rendezvous is), so on node 0 that address itself. A node's name may not resolve to it (a
    name in /etc/hosts on 127.0.1.1, a node on several networks); this route does. Falls back
    to the host name without a launch address."""
    launch = os.environ.get("SLURM_LAUNCH_NODE_IPADDR")
    if not launch:
        return socket.gethostname()
    family = socket.AF_INET6 if ":" in launch else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((launch, 9))  # UDP: picks the route, sends nothing
        return str(probe.getsockname()[0])


def _memory_from_slurm() -> None:
    """The node's cgroup gets the allocation's memory (`--mem`, Slurm's `SLURM_MEM_PER_NODE`,
    MiB) shared by its slots (`TORCHYARD_SLOT_MEMORY_MB`, `workers.isolation.cgroups`), so a rank
    over it is OOM-killed in the job's own cgroup and the attempt fails as `oom`, as on any
    worker."""
    memory = os.environ.get("SLURM_MEM_PER_NODE")
    slots = int(os.environ.get("TORCHYARD_WORKER_SLOTS", "1"))
    if memory and memory.isdigit() and int(memory) > 0:
        os.environ.setdefault("TORCHYARD_SLOT_MEMORY_MB", str(max(1, int(memory) // slots)))


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers slurm-node", description=__doc__)
    parser.add_argument("--job", type=int, required=True, help="the Torchyard job id")
    known = parser.parse_args(args)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    slurm_job_id = int(os.environ["SLURM_JOB_ID"])
    node_id = int(os.environ.get("SLURM_NODEID", "0"))
    host = socket.gethostname()
    _memory_from_slurm()
    if int(os.environ.get("SLURM_JOB_NUM_NODES", "1")) > 1:
        os.environ["TORCHYARD_ADVERTISE_HOST"] = node_address()
    get_settings.cache_clear()  # `python -m workers` read them before the lines above
    settings = get_settings()
    factory = session_factory(get_host_engine(settings))
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    worker = agent_worker(slurm_job_id, restart, host)
    log.info(
        "Slurm job %s node %s on %s: %s slots, %s MiB each",
        slurm_job_id,
        node_id,
        host,
        settings.worker_slots,
        settings.slot_memory_mb or "unlimited",
    )
    shutdown = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: shutdown.set())
    with factory() as session:
        job = session.get(Job, known.job)
        pool = job.pool if job is not None else "slurm"
    allocator = devices.host_allocator()
    heartbeat = liveness.WorkerHeartbeat(
        name=worker,
        pool=pool,
        started_at=utcnow(),
        factory=factory,
        settings=settings,
        slots=lambda: (allocator.capacity, allocator.free),
        sandbox=f"slurm job {slurm_job_id}, node {node_id}",
    )
    heartbeat.start()
    from workers.tasks import dispatch  # the broker, as a worker's (imports the Celery app)

    run = lead if node_id == 0 else follow_lead
    try:
        outcome = run(
            known.job,
            settings=settings,
            factory=factory,
            worker=worker,
            slurm_job_id=slurm_job_id,
            dispatch=dispatch,
            shutdown=shutdown,
        )
    finally:
        heartbeat.stop()
    log.info("job %s, Slurm job %s node %s: %s", known.job, slurm_job_id, node_id, outcome)
