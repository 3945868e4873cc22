"""The worker's tasks: thin, named, taking ids. The work lives in `node` and `reconcile`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator
from typing import Any

from celery import signals
from sqlalchemy.exc import OperationalError

from core.platform.db import get_host_engine, session_factory
from core.platform.logs import job_id_var
from core.platform.queue import EXPORT_CHECKPOINT_TASK, JOIN_GANG_TASK, RECONCILE_TASK, RUN_JOB_TASK
from core.platform.settings import Settings, get_settings
from core.platform.tables import utcnow
from workers import devices, exports, liveness, node
from workers import reconcile as reconciler
from workers.app import CONTROL_QUEUE, app
from workers.isolation import netfence, sandbox
from workers.slurm import submitter

# Set when this worker starts a warm or cold shutdown: a running job is stopped (the trainer
# checkpoints) and handed back to the queue instead of being orphaned or waited for.
shutting_down = threading.Event()


log = logging.getLogger(__name__)
# This process's row in `workers`, kept fresh by a thread from `worker_ready` to shutdown.
heartbeat: liveness.WorkerHeartbeat | None = None
fence: netfence.Fence | None = None  # the network fence this worker installed
watcher: submitter.Watcher | None = None  # a Slurm pool's submitter follows its Slurm jobs


@signals.worker_ready.connect
def _start_heartbeat(sender: Any, **_: Any) -> None:
    """Beat from now on; once registered, requeue what the previous incarnation of this
    worker (same name) was running: its trainers died with it, and it is never adopted."""
    global heartbeat
    settings = get_settings()
    name = liveness.worker_name(sender.hostname)
    factory = session_factory(get_host_engine(settings))
    queues = sorted(q for q in sender.app.amqp.queues.consume_from if q != CONTROL_QUEUE)
    # Celery's start time: before this process consumed anything, so before any claim of its.
    started_at = getattr(sender.controller, "startup_time", None) or utcnow()

    def reap_previous_incarnation() -> None:
        scope = reconciler.Scope(now=utcnow(), silence=False, worker=name)
        reconciler.reap(settings=settings, session_factory=factory, dispatch=dispatch, scope=scope)

    slurm = submitter.slurm_pools_served(settings, queues)
    if slurm:  # a Slurm pool's submitter: the node agents run (and contain) the jobs
        global watcher
        watcher = submitter.Watcher(
            settings=settings, factory=factory, dispatch=dispatch, pools=slurm
        )
        watcher.start()
    heartbeat = liveness.WorkerHeartbeat(
        name=name,
        pool=",".join(queues) or CONTROL_QUEUE,
        started_at=started_at,
        factory=factory,
        settings=settings,
        on_registered=reap_previous_incarnation,
        slots=lambda: (devices.host_allocator().capacity, devices.host_allocator().free),
        sandbox=(
            None  # an exporter's or a control worker's: no job's code runs there
            if set(queues) <= {settings.export_queue}
            else "slurm submitter: the node agents contain the jobs"
            if slurm
            else _contain(settings, name)
        ),
    )
    heartbeat.start()


def _contain(settings: Settings, name: str) -> str:
    """How this worker contains its jobs, for its row (`GET /v1/workers`): the sandbox and,
    sandboxed, the network fence it installs now (`workers.isolation.netfence`) or why there is
    none."""
    global fence
    described = sandbox.describe(settings.sandbox, settings.env)
    if described != "bwrap":
        return described
    installed = netfence.install(settings, name, settings.fenced_destinations)
    if isinstance(installed, str):
        log.warning("jobs with the network are not fenced off the control plane: %s", installed)
        return f"bwrap, network not fenced: {installed}"[:500]
    fence = installed
    return "bwrap, network fenced"


@signals.worker_shutting_down.connect
def _on_worker_shutting_down(**_: Any) -> None:
    shutting_down.set()
    if heartbeat is not None:
        heartbeat.mark_stopping()


@signals.worker_shutdown.connect
def _stop_heartbeat(**_: Any) -> None:
    if heartbeat is not None:
        heartbeat.stop()
    if fence is not None:
        fence.remove()


def _worker_name(task: Any) -> str:
    """The name this worker records on what it claims (and on its row in `workers`)."""
    return liveness.worker_name(task.request.hostname)


@contextlib.contextmanager
def _job_logs(job_id: int) -> Iterator[None]:
    """Every log record inside says which job it is about (`core.platform.logs`)."""
    token = job_id_var.set(job_id)
    try:
        yield
    finally:
        job_id_var.reset(token)


def dispatch(job_id: int, queue: str) -> None:
    """Send `workers.run_job(job_id)` to the pool's queue."""
    app.send_task(RUN_JOB_TASK, args=[job_id], queue=queue)


def send_join(job_id: int, attempt: int, queue: str) -> None:
    """Send `workers.join_gang(job_id, attempt)` (one further node of a gang) to `queue`."""
    app.send_task(JOIN_GANG_TASK, args=[job_id, attempt], queue=queue)


@app.task(
    name=RUN_JOB_TASK,
    bind=True,
    acks_late=True,
    # Only the claim and the final write reach the DB outside the supervise loop; both are
    # safe to repeat (a repeated claim loses, a repeated end finds the attempt over).
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def run_job(self: Any, job_id: int) -> str:
    """Run the job if it is still queued (assert the world: the claim re-reads the row)."""
    settings = get_settings()
    factory = session_factory(get_host_engine(settings))
    if settings.slurm_pools and submitter.pool_of(factory, job_id) in settings.slurm_pools:
        with _job_logs(job_id):
            return submitter.place(job_id, settings=settings, factory=factory)
    with _job_logs(job_id):
        return node.run_job(
            job_id,
            settings=settings,
            factory=factory,
            worker=_worker_name(self),
            dispatch=dispatch,
            shutdown=shutting_down,
            send_join=send_join,
        )


@app.task(
    name=JOIN_GANG_TASK,
    bind=True,
    acks_late=True,
    # A repeated join finds its slot taken (fencing UPDATE) or the attempt over.
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def join_gang(self: Any, job_id: int, attempt: int) -> str:
    """Become a further node of attempt `attempt` of multi-node job `job_id`, if a slot is free."""
    settings = get_settings()
    with _job_logs(job_id):
        return node.join_gang(
            job_id,
            attempt,
            settings=settings,
            factory=session_factory(get_host_engine(settings)),
            worker=_worker_name(self),
            dispatch=dispatch,
            send_join=send_join,
            shutdown=shutting_down,
        )


@app.task(
    name=EXPORT_CHECKPOINT_TASK,
    bind=True,
    acks_late=True,
    # A repeated delivery finds the export no longer pending (claim-by-UPDATE) and returns.
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def export_checkpoint(self: Any, export_id: int) -> str:
    """Export one checkpoint to safetensors if its export is still pending."""
    return exports.run_export(
        export_id,
        factory=session_factory(get_host_engine(get_settings())),
        worker=_worker_name(self),
    )


@app.task(name=RECONCILE_TASK)
def reconcile() -> dict[str, list[int]]:
    """Requeue or end jobs whose worker is gone and re-send queued jobs nobody claimed."""
    settings = get_settings()
    report = reconciler.reconcile_deployed(
        settings=settings,
        session_factory=session_factory(get_host_engine(settings)),
        dispatch=dispatch,
        steady_s=heartbeat.steady_s() if heartbeat is not None else 0.0,
    )
    return dataclasses.asdict(report)
