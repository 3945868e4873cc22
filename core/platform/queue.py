"""Task names and Celery configuration, shared by the API (sender) and the workers.

Only plain data here: `api/` builds a Celery client from it and `workers/` the Celery app, so
the API can dispatch by name without importing worker code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.platform.settings import Settings

RUN_JOB_TASK = "workers.run_job"
# One per further node of a multi-node job, sent by its node 0 to the pool's queue.
JOIN_GANG_TASK = "workers.join_gang"
RECONCILE_TASK = "workers.reconcile"
# Export one checkpoint to safetensors (`core.jobs.exports`); sent by the API to the job's pool.
EXPORT_CHECKPOINT_TASK = "workers.export_checkpoint"


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings for both ends of the broker."""
    config: dict[str, Any] = {
        "broker_url": settings.broker_url,
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,
        # A job message is acknowledged after the task returns, so a worker that dies mid-run
        # gets its job redelivered; claim-by-UPDATE makes the redelivery harmless.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": "default",
        "worker_hijack_root_logger": False,
    }
    if settings.broker_url.startswith("filesystem"):
        folder = (settings.home / "broker").resolve()
        for sub in ("queue", "processed", "control"):
            Path(folder, sub).mkdir(parents=True, exist_ok=True)
        config["broker_transport_options"] = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
        }
    elif settings.broker_url.startswith(("redis", "rediss")):
        # Multi-hour jobs outlive the default 1 h: redelivery is fenced anyway.
        config["broker_transport_options"] = {"visibility_timeout": 12 * 3600}
    return config
