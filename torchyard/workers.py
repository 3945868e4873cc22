"""The deployment's workers, as their heartbeats last described them (``GET /v1/workers``):
the pools each serves, its free and total slots, whether it is alive or stopping, and how it
contains its jobs' ranks (`sandbox`: ``bwrap``, or ``none: <why>``).

    with Client() as client:
        for worker in client.workers.list():
            print(worker.name, worker.pool, worker.alive, worker.sandbox)

``torchyard workers`` prints them as a table.
"""

from __future__ import annotations

from datetime import datetime

from torchyard.transport import Transport
from torchyard.types import _Model


class Worker(_Model):
    """One worker process. `pool`: the queues it serves, comma-separated; `slots_free` None
    when unknown; `alive`: its heartbeat is newer than the server's worker timeout;
    `sandbox` None for an exporter (no job's code runs there)."""

    name: str
    pool: str
    host: str
    slots_total: int
    slots_free: int | None = None
    started_at: datetime
    heartbeat_at: datetime
    alive: bool
    stopping: bool = False
    sandbox: str | None = None


class Workers:
    """``client.workers``: the deployment's workers (any key that can read sees them)."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    def list(self) -> list[Worker]:
        """Every worker, newest heartbeat first."""
        answer = self._client.request("GET", "/v1/workers")
        return [Worker.model_validate(w) for w in answer.get("items", [])]
