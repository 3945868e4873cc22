"""The Celery app of the workers.

A worker owns its host's devices (`workers.devices`: its GPUs, or `TORCHYARD_WORKER_SLOTS` CPU
slots) and runs as many jobs at once as fit them, each on its own devices, in one process:
Celery's `threads` pool with one thread per device (`--concurrency` defaults to the device
count, `_size_pool`), prefetch 1 so it holds no message it has no thread for:

    celery -A workers.app:app worker -Q <pool> --pool threads --prefetch-multiplier 1

Celery beat (`celery -A workers.app:app beat`) sends `workers.reconcile` every
`RECONCILE_INTERVAL_S` (2 s) to the control queue, which every worker also consumes: an idle
worker runs it. When every worker may be busy with a long job, run a small worker for it
alone, with beat embedded:

    celery -A workers.app:app worker -Q torchyard.control --pool solo -B

(`python -m workers worker --pool <pool>` and `python -m workers control` are the same.)
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, signals

from core.platform.control import RECONCILE_INTERVAL_S
from core.platform.logs import configure_json_logging
from core.platform.queue import RECONCILE_TASK, celery_config
from core.platform.settings import Settings, get_settings
from workers import devices
from workers.isolation import cgroups, sandbox

log = logging.getLogger(__name__)

CONTROL_QUEUE = "torchyard.control"
# RECONCILE_INTERVAL_S (core.platform.control, 2 s): a lost worker is requeued within
# worker_timeout_s (10 s) + this + a task's delivery (~1 s on a loaded host): 13 s at worst,
# under the 15 s the platform promises. An idle reconcile is two indexed selects (active jobs
# and their live gang nodes joined to the workers' rows; queued jobs past the redispatch age):
# 27 ms in all, measured on the loaded 2-core test host with 2,000 jobs.


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery("torchyard", include=["workers.tasks"])
    app.conf.update(celery_config(settings))
    app.conf.task_routes = {RECONCILE_TASK: {"queue": CONTROL_QUEUE}}
    app.conf.beat_schedule = {
        "reconcile": {
            "task": RECONCILE_TASK,
            "schedule": RECONCILE_INTERVAL_S,
            # A reconcile nobody ran in time is superseded by the next one.
            "options": {"queue": CONTROL_QUEUE, "expires": RECONCILE_INTERVAL_S},
        }
    }
    return app


@signals.worker_init.connect
def _log_to_stderr(**_: Any) -> None:
    """Celery leaves the root logger alone (`worker_hijack_root_logger=False`): give ours one,
    writing JSON lines that carry the job id of the task in progress (`core.platform.logs`)."""
    if not logging.getLogger().handlers:
        configure_json_logging("")


@signals.celeryd_init.connect
def _size_pool(conf: Any, options: dict[str, Any], **_: Any) -> None:
    """One pool thread per device of the host unless `--concurrency` says otherwise: each job
    takes at least one device, so a thread is free for every job that can fit."""
    if not options.get("concurrency"):
        conf.worker_concurrency = devices.host_allocator().capacity


@signals.celeryd_init.connect
def _refuse_unsandboxed(options: dict[str, Any], **_: Any) -> None:
    """A worker that runs jobs decides at startup whether it sandboxes them
    (`workers.isolation.sandbox.enabled`), and refuses to start where it must and cannot; an
    exporter or a control worker (no job's code) starts anyway. Said once, in the worker's log."""
    queues = options.get("queues") or []
    names = set(queues.split(",") if isinstance(queues, str) else queues)
    settings = get_settings()
    if names and names <= {settings.export_queue, CONTROL_QUEUE}:
        return
    try:
        on = sandbox.enabled(settings.sandbox, settings.env)
    except sandbox.SandboxUnavailable as exc:
        log.critical("worker refused to start: %s", exc)
        raise SystemExit(f"torchyard worker: {exc}") from None
    log.info("jobs' ranks run %s", "in a bubblewrap sandbox" if on else "unsandboxed")
    if removed := cgroups.sweep():
        log.info("removed %s empty job cgroups an earlier worker left", removed)


@signals.worker_ready.connect
def _consume_control_queue(sender: Any, **_: Any) -> None:
    """Every worker also takes the reconciler's messages (`-Q` names only the pool)."""
    if CONTROL_QUEUE not in sender.app.amqp.queues.consume_from:
        sender.add_task_queue(CONTROL_QUEUE)


app = create_app()
