"""Bodies of `GET /v1/workers` (`api/routes/workers.py`): the workers of the deployment."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from api import openapi_examples
from api.schemas import Timestamp

_EXAMPLE: dict[str, Any] = {
    "name": "gpu-7@gpu-7",
    "pool": "a100",
    "host": "gpu-7",
    "slots_total": 8,
    "slots_free": 6,
    "started_at": "2026-11-27T08:00:00Z",
    "heartbeat_at": "2026-11-27T12:00:01Z",
    "alive": True,
    "stopping": False,
    "sandbox": "bwrap",
}


class WorkerOut(BaseModel):
    """One worker process, as its own heartbeat last wrote it."""

    model_config = openapi_examples.config(_EXAMPLE)

    name: str = Field(description="The name it records on the jobs it runs (`jobs.worker`).")
    pool: str = Field(description="The pools (queues) it serves, comma-separated.")
    host: str = Field(description="The host name of its machine.")
    slots_total: int = Field(description="Its devices: GPUs, or CPU slots.")
    slots_free: int | None = Field(description="Devices no job holds now (null: unknown).")
    started_at: Timestamp = Field(description="When this process started (its incarnation).")
    heartbeat_at: Timestamp = Field(description="Its last heartbeat, from its own clock.")
    alive: bool = Field(
        description="Its heartbeat is newer than `TORCHYARD_WORKER_TIMEOUT_S`: older, the "
        "process is gone and its jobs are requeued."
    )
    stopping: bool = Field(description="In a warm shutdown: it takes no new job.")
    sandbox: str | None = Field(
        description="How it contains its jobs' ranks (docs/security.md): `bwrap`, or "
        "`none: <why>` (the setting, or what the host lacks: then a job can read what the "
        "worker reads); null for an exporter (no job's code runs there) or a worker older "
        "than this field."
    )


class WorkerList(BaseModel):
    model_config = openapi_examples.config({"items": [_EXAMPLE]})

    items: list[WorkerOut] = Field(description="Every worker, newest heartbeat first.")
